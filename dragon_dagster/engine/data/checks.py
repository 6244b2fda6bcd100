"""The checks every dataset artifact gets: usable rows (dataset_quality) and, for mapped datasets, held-out rows
that do not repeat training rows (held_out_not_leaking). Judged from the artifact alone (config/checks.py)."""

from __future__ import annotations

from pathlib import Path

from ..artifacts.manifest import DatasetManifest, read_manifest
from ..config.checks import CheckOutcome, CheckSpec
from .row_parts import quality
from .tables import read_jsonl

MAX_DUPLICATE_SHARE = 0.2
# Held-out rows whose prompt or answer also appears word for word in train measure recall, not generalization.
# After exact duplicates are dropped any overlap is a leak, so the bound is 0.
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


def leak_problem(prompt: float, answer: float, answers_count: bool = True, fix: str = LEAK_FIX) -> str | None:
    """What is wrong with a split whose held-out rows repeat train (shares of prompts and answers), and the fix
    (in the words of where the settings are made: the YAML's keys by default); None when nothing leaks."""
    if not (prompt > MAX_OVERLAP or (answers_count and answer > MAX_OVERLAP)):
        return None
    return (
        f"{prompt:.0%} of the held-out rows have a prompt and {answer:.0%} an answer that also "
        f"appear in train: held-out figures would measure recall. {fix}"
    )


def leakage_check(allow_leakage: bool, answers_count: bool) -> CheckSpec:
    """Blocking: the held-out rows share no prompt (nor, where answers are text trained on, answer) with train. A
    prompt dataset's reference answers (a number, a label) repeat across different prompts by nature and are never
    trained on as text, so its answer overlap is reported but does not fail the check."""
    figures = "prompt_overlap" + (" or answer_overlap" if answers_count else "")

    def judge(artifact: Path) -> CheckOutcome:
        manifest = read_manifest(artifact, DatasetManifest)
        prompt, answer = manifest.prompt_overlap, manifest.answer_overlap
        description = leak_problem(prompt, answer, answers_count)
        leaking = description is not None
        return CheckOutcome(
            passed=not leaking,
            description=description,
            severity="warn" if allow_leakage else "error",
            metadata={
                "prompt_overlap": prompt,
                "answer_overlap": answer,
                "max_overlap": MAX_OVERLAP,
                "answer_overlap_counts": answers_count,
                "allow_leakage": allow_leakage,
                "duplicates_dropped": manifest.duplicates_dropped,
            },
        )

    return CheckSpec(
        "held_out_not_leaking",
        f"No held-out row's {figures.replace('_overlap', '')} also appears in train (overlap above {MAX_OVERLAP}); "
        + ("allow_leakage: true makes it a warning." if allow_leakage else "blocks the stages after it."),
        judge,
        blocking=True,
    )
