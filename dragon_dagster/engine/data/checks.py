"""The checks every dataset artifact gets: usable rows (dataset_quality) and, for mapped datasets, held-out rows
that do not repeat training rows (held_out_not_leaking) and no personal data (no_personal_data, also on the
datasets retraining makes from feedback). Judged from the artifact alone (config/checks.py)."""

from __future__ import annotations

from pathlib import Path

from ..artifacts.manifest import DatasetManifest, PiiReport, read_manifest
from ..config.checks import CheckOutcome, CheckSpec
from .holdout import IDENTIFYING_ANSWER_WORDS
from .row_parts import quality
from .tables import read_jsonl

MAX_DUPLICATE_SHARE = 0.2
# Held-out rows whose prompt repeats a training prompt (word for word or nearly), or whose answer repeats one that
# identifies a training row, measure recall, not generalization. Any such row is a leak, so the bound is 0. A short
# answer two different rows happen to share is a coincidence: reported, never blocking (holdout.overlap).
MAX_OVERLAP = 0.0


def quality_reason(figures: dict) -> str:
    """Why a dataset failed dataset_quality, and what to change."""
    if figures["rows"] == 0:
        return (
            "The dataset has no rows: check the source's path and the columns its prompt and response templates "
            "name (rows with an empty field are dropped)."
        )
    if figures["empty_prompts"] or figures["empty_replies"]:
        return (
            f"{figures['empty_prompts']} rows have an empty prompt and {figures['empty_replies']} an empty reply: "
            "fill or drop them in the source, or point prompt/response at columns that are always set."
        )
    return (
        f"{figures['duplicate_share']:.0%} of the rows are duplicates (the limit is {MAX_DUPLICATE_SHARE:.0%}): "
        "drop the repeated rows from the source, or template more of its columns into the prompt so rows differ."
    )


def quality_check() -> CheckSpec:
    def judge(artifact: Path) -> CheckOutcome:
        figures = quality(read_jsonl(artifact / "train.jsonl") + read_jsonl(artifact / "eval.jsonl"))
        broken = figures["rows"] == 0 or figures["empty_prompts"] > 0 or figures["empty_replies"] > 0
        ok = not broken and figures["duplicate_share"] <= MAX_DUPLICATE_SHARE
        return CheckOutcome(
            passed=ok,
            metadata=figures,
            description=None if ok else quality_reason(figures),
            severity="error" if broken else "warn",
        )

    return CheckSpec(
        "dataset_quality",
        "Non-empty, no empty prompt or response (an ERROR that blocks the stages after it); "
        f"duplicates under {MAX_DUPLICATE_SHARE:.0%} (a warning).",
        judge,
        blocking=True,
    )


LEAK_FIX = "Set group_by to a column that keeps related rows together, or allow_leakage: true."


def blocking_overlap(leakage) -> tuple[float, float]:
    """The shares the leak check judges, from holdout.overlap's figures or a manifest: held-out prompts that
    repeat a training prompt word for word or nearly, and answers that identify a training row. Figures from
    before near-duplicates (no such keys, or None) judge the word-for-word shares."""
    get = leakage.get if isinstance(leakage, dict) else lambda key: getattr(leakage, key, None)
    prompt, answer = get("near_prompt_overlap"), get("identifying_answer_overlap")
    return (get("prompt_overlap") if prompt is None else prompt, get("answer_overlap") if answer is None else answer)


def leak_problem(prompt: float, answer: float, answers_count: bool = True, fix: str = LEAK_FIX) -> str | None:
    """What is wrong with a split whose held-out rows repeat train (blocking_overlap's shares of prompts and
    answers), and the fix (in the words of where the settings are made: the YAML's keys by default); None when
    nothing leaks."""
    if not (prompt > MAX_OVERLAP or (answers_count and answer > MAX_OVERLAP)):
        return None
    return (
        f"{prompt:.0%} of the held-out rows have a prompt that also appears in train (word for word or as a "
        f"near-copy) and {answer:.0%} an answer that identifies a training row (repeated word for word, "
        f"{IDENTIFYING_ANSWER_WORDS} words or more or with a near-copy of its prompt): held-out figures would "
        f"measure recall. {fix}"
    )


def leakage_check(allow_leakage: bool, answers_count: bool) -> CheckSpec:
    """Blocking: the held-out rows share no prompt (nor, where answers are text trained on, answer) with train. A
    prompt dataset's reference answers (a number, a label) repeat across different prompts by nature and are never
    trained on as text, so its answer overlap is reported but does not fail the check."""
    figures = "prompt (word for word or a near-copy)" + (
        " or identifying answer (repeated word for word: long, or with its prompt)" if answers_count else ""
    )

    def judge(artifact: Path) -> CheckOutcome:
        manifest = read_manifest(artifact, DatasetManifest)
        prompt, answer = blocking_overlap(manifest)
        description = leak_problem(prompt, answer, answers_count)
        leaking = description is not None
        near = manifest.near_duplicates
        return CheckOutcome(
            passed=not leaking,
            description=description,
            severity="warn" if allow_leakage else "error",
            metadata={
                "prompt_overlap": manifest.prompt_overlap,
                "near_prompt_overlap": prompt,
                "answer_overlap": manifest.answer_overlap,
                "identifying_answer_overlap": answer,
                # repeated short answers with unrelated prompts: shown, not judged
                "coincidental_answer_overlap": round(max(0.0, manifest.answer_overlap - answer), 4),
                "max_overlap": MAX_OVERLAP,
                "answer_overlap_counts": answers_count,
                "allow_leakage": allow_leakage,
                "duplicates_dropped": manifest.duplicates_dropped,
                **({"near_duplicate_clusters": near.clusters} if near else {}),
            },
        )

    return CheckSpec(
        "held_out_not_leaking",
        f"No held-out row's {figures} also appears in train (overlap above {MAX_OVERLAP}); "
        + ("allow_leakage: true makes it a warning." if allow_leakage else "blocks the stages after it."),
        judge,
        blocking=True,
    )


def pii_problem(report: PiiReport, fix: str) -> str:
    """What the scan found, the first rows it names (masked) and the fix, in one description."""
    found = ", ".join(f"{n} {entity}" for entity, n in report.counts.items())
    named = "; ".join(
        f"{report.unit} {f.row}{f' of {f.source}' if f.source else ''} ({f.field}): {f.entity} in {f.snippet!r}"
        for f in report.findings[:5]
    )
    return f"personal data in {report.rows_with_pii} of {report.rows_scanned} {report.unit}s ({found}): {named}. {fix}"


PII_FIX = "Set pii: redact (placeholders, rows kept), remove those rows from the source, or pii: warn."


def pii_check(mode: str, fix: str = PII_FIX) -> CheckSpec:
    """No personal data in the rows (engine/data/pii.py's scan, recorded in the manifest): block fails as an
    ERROR that stops the stages after it, warn fails as a warning, redact passes (the pieces were replaced)."""

    def judge(artifact: Path) -> CheckOutcome:
        recorded = (read_manifest(artifact).model_extra or {}).get("pii")
        if recorded is None:
            return CheckOutcome(passed=True, metadata={"scanned": False})
        report = PiiReport.model_validate(recorded)
        metadata = {
            "pii": report.mode,
            "rows_scanned": report.rows_scanned,
            "rows_with_pii": report.rows_with_pii,
            **{f"pii_{entity.lower()}": n for entity, n in report.counts.items()},
            "redacted": report.redacted,
            "examples": [f.model_dump(exclude_none=True) for f in report.findings[:5]],
            "not_detected": report.not_detected,
            "scan_seconds": report.seconds,
        }
        if not report.rows_with_pii or report.mode == "redact":
            return CheckOutcome(passed=True, metadata=metadata)
        return CheckOutcome(
            passed=False,
            metadata=metadata,
            description=pii_problem(report, fix),
            severity="error" if report.mode == "block" else "warn",
        )

    return CheckSpec(
        "no_personal_data",
        "No e-mail address, phone number, card number or IP address in the rows (names are not looked for); "
        + {
            "warn": "a warning (pii: warn).",
            "redact": "passes once they are replaced by placeholders (pii: redact).",
            "block": "an ERROR that blocks the stages after it (pii: block).",
        }[mode],
        judge,
        blocking=True,
    )
