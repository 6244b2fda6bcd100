"""The reward_model kind's checks: its loss falls, and it ranks held-out pairs better than a coin."""

from __future__ import annotations

from pathlib import Path

from ...artifacts.manifest import AdapterManifest, read_manifest
from ...config.checks import CheckOutcome, CheckSpec
from ...train.stage import losses_check
from .result import RewardModelResult
from .settings import RewardModel


def accuracy_check(least: float) -> CheckSpec:
    def judge(artifact: Path) -> CheckOutcome:
        result = read_manifest(artifact, AdapterManifest[RewardModelResult]).result
        metadata = {"eval_pairs": result.eval_pairs, "least": least}
        if result.accuracy is None:
            return CheckOutcome(
                False,
                metadata,
                "No held-out pairs: the reward model's ranking was never measured. Give its pairs dataset an "
                "eval_frac above 0.",
            )
        metadata.update(accuracy=result.accuracy, margin=result.margin if result.margin is not None else "-")
        passed = result.accuracy >= least
        description = (
            None
            if passed
            else f"The reward model ranks {result.accuracy:.0%} of {result.eval_pairs} held-out pairs right "
            f"(min_accuracy {least:.0%}): a policy optimized against it learns its mistakes. Train on more or "
            "cleaner pairs, or for more steps."
        )
        return CheckOutcome(passed, metadata, description)

    return CheckSpec(
        "held_out_accuracy",
        f"The reward model scores the chosen reply above the rejected one on at least {least:.0%} of held-out pairs.",
        judge,
    )


def reward_model_checks(stage: RewardModel) -> list[CheckSpec]:
    return [losses_check(), accuracy_check(stage.min_accuracy)]
