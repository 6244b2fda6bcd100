"""The distill kind's checks: the adapter's (its loss finite and falling), and the student closer to the teacher
on the held-out prompts after training than before (what the stage is for)."""

from __future__ import annotations

import math
from pathlib import Path

from ...artifacts.manifest import AdapterManifest, read_manifest
from ...config.checks import CheckOutcome, CheckSpec
from ...train.stage import adapter_checks
from .result import DistillResult
from .settings import Distill


def closer_check() -> CheckSpec:
    def judge(artifact: Path) -> CheckOutcome:
        result = read_manifest(artifact, AdapterManifest[DistillResult]).result
        before, after = result.divergence_before, result.divergence_after
        measured = all(isinstance(x, float) and math.isfinite(x) for x in (before, after))
        metadata = {"divergence_before": before, "divergence_after": after} if measured else {}
        if not measured:
            return CheckOutcome(True, metadata, "No held-out prompts to measure the divergence on.")
        closer = after < before
        return CheckOutcome(
            closer,
            metadata,
            None
            if closer
            else f"The student's divergence from the teacher on the held-out prompts went {before:.4g} -> "
            f"{after:.4g}: it did not move towards the teacher. Train more steps (args.max_steps), raise "
            "args.learning_rate, or check that the teacher is better at the task than the student.",
        )

    return CheckSpec(
        "student_closer_to_teacher",
        "The student's divergence from the teacher over its own held-out replies is lower after training.",
        judge,
    )


def distill_checks(stage: Distill) -> list[CheckSpec]:
    return [*adapter_checks(stage), closer_check()]
