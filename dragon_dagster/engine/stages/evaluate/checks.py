"""The evaluate kind's check: the merged model is not worse than its base, and passing makes it the champion."""

from __future__ import annotations

import json
from pathlib import Path

from ...artifacts.manifest import ReportManifest, read_manifest
from ...config.checks import CheckOutcome, CheckSpec, Promotion
from ...config.stage import Stage
from .result import ReportResult


def read_report(artifact: Path) -> ReportResult:
    return ReportResult.model_validate(json.loads((Path(artifact) / "report.json").read_text()))


def not_worse_check() -> CheckSpec:
    def judge(artifact: Path) -> CheckOutcome:
        report = read_report(artifact)
        passed = bool(report.merged_not_worse)
        merged = read_manifest(artifact, ReportManifest).merged
        base_loss, merged_loss = report.base.get("eval_loss"), report.merged.get("eval_loss")
        basis = f"on {report.not_worse_on}" if report.not_worse_on else f"eval loss {merged_loss} against {base_loss}"
        if passed:
            description = None
        elif report.merged_not_worse is None:
            description = (
                "Nothing to compare the merged model and its base on (no GRPO rewards and no reference answers), so "
                "it was not made the champion: give the stage's dataset a reference column."
            )
        else:
            description = (
                f"The merged model is worse than its base on the held-out rows ({basis}), so it was not made the "
                "champion: see report.md, and train the stages before it longer or with another args.learning_rate."
            )
        return CheckOutcome(
            passed,
            {"base_eval_loss": base_loss, "merged_eval_loss": merged_loss},
            description,
            promote=Promotion(merged, "not worse than the base model") if passed else None,
        )

    return CheckSpec(
        "merged_not_worse_than_base",
        "The merged model's held-out loss is not above the base model's (a warning). Passing makes the merged model "
        "the champion in the MLflow Model Registry, unless the champion is a model retrained from feedback.",
        judge,
        promotes=True,
    )


def report_checks(stage: Stage) -> list[CheckSpec]:
    return [not_worse_check()]
