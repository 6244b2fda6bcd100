"""The export kind's check: every GGUF file, loaded back, picks the merged model's greedy reply tokens at least
min_token_agreement of the time. A warning, not a block: a low-bit file of a small model is expected to drift
(q4_0 on SmolLM2-135M), and the files are written either way; the check says which ones to ship with care."""

from __future__ import annotations

from pathlib import Path

from ...artifacts.manifest import ExportManifest, read_manifest
from ...config.checks import CheckOutcome, CheckSpec
from .settings import Export


def agreement_check(floor: float) -> CheckSpec:
    def judge(artifact: Path) -> CheckOutcome:
        files = read_manifest(artifact, ExportManifest).files
        metadata: dict = {"min_token_agreement": floor}
        below, unverified = [], []
        for f in files:
            if f.agreement is None:
                unverified.append(f.format)
                continue
            metadata[f"{f.format}_token_agreement"] = f.agreement.token_agreement
            metadata[f"{f.format}_identical_replies"] = f"{f.agreement.identical_replies}/{f.agreement.prompts}"
            if f.agreement.token_agreement < floor:
                below.append(f"{f.format} ({f.agreement.token_agreement:.1%})")
        why = []
        if below:
            why.append(
                f"{', '.join(below)} of the merged model's greedy reply tokens picked by the file loaded back, "
                f"under min_token_agreement={floor}: the file replies differently from the model it was made of. "
                "Ship a larger format (q8_0, f16), or lower min_token_agreement if the drift is accepted"
            )
        if unverified:
            why.append(f"{', '.join(unverified)} not verified (no agreement recorded): export again to verify")
        return CheckOutcome(not why, metadata, "; ".join(why) + "." if why else None)

    return CheckSpec(
        "gguf_replies_agree",
        f"Each GGUF file, loaded back with transformers, picks at least {floor:.0%} of the merged model's greedy "
        "reply tokens on the export's fixed prompts (a warning: the files are written either way).",
        judge,
    )


def export_checks(stage: Export) -> list[CheckSpec]:
    return [agreement_check(stage.min_token_agreement)]
