"""Asset checks: each stage kind declares its checks as plain data (engine/config/checks.py: a name, a
description, how to judge the artifact); here each becomes a Dagster asset check on the stage's asset, judged on
its latest materialization. A passing check that asks for it makes the merged model it names the champion."""

from __future__ import annotations

from pathlib import Path

from dagster import AssetCheckResult, AssetCheckSeverity, AssetKey, asset_check

from ..engine import catalog
from ..engine.config.checks import CheckOutcome, CheckSpec
from ..engine.pipeline import Pipeline
from ..engine.pipeline.contamination import evaluation_datasets, judge_contamination
from ..engine.stages.evaluate.settings import Evaluate
from ..resources import MLflowTracking
from .asset_wiring import key as stage_key
from .launchpad import run_settings
from .metadata import as_metadata
from .promotion import promote_merged

SEVERITY = {"warn": AssetCheckSeverity.WARN, "error": AssetCheckSeverity.ERROR}


def latest_path(context, key: AssetKey) -> Path:
    event = context.instance.get_latest_materialization_event(key)
    return Path(event.asset_materialization.metadata["artifact_dir"].value)


def asset_checks(key: AssetKey, specs: list[CheckSpec]) -> list:
    """A Dagster asset check for each of a stage's check specs."""
    return [_asset_check(key, spec) for spec in specs]


def _asset_check(key: AssetKey, spec: CheckSpec):
    if spec.promotes:

        @asset_check(asset=key, name=spec.name, blocking=spec.blocking, description=spec.description)
        def _promoting(context, tracking: MLflowTracking) -> AssetCheckResult:
            return _result(context, key, spec, tracking)

        return _promoting

    @asset_check(asset=key, name=spec.name, blocking=spec.blocking, description=spec.description)
    def _check(context) -> AssetCheckResult:
        return _result(context, key, spec)

    return _check


def _result(context, key: AssetKey, spec: CheckSpec, tracking: MLflowTracking | None = None) -> AssetCheckResult:
    outcome = spec.judge(latest_path(context, key))
    metadata = dict(outcome.metadata)
    if outcome.passed and outcome.promote is not None and tracking is not None:
        merged = outcome.promote.merged_dir
        # replaces a champion from this pipeline's own merges, never a retrained one (that one learned from
        # feedback, and this check does not compare with it): then this model stays the challenger
        metadata.update(
            promote_merged(
                context,
                key.path[0],
                tracking,
                merged,
                f"{key.to_user_string()}: {outcome.promote.reason}",
                only_over=(f"{key.path[0]}/{Path(merged).parent.name}",),
            )
        )
    return _check_result(outcome, metadata)


def _check_result(outcome: CheckOutcome, metadata: dict | None = None) -> AssetCheckResult:
    return AssetCheckResult(
        passed=outcome.passed,
        severity=SEVERITY[outcome.severity],
        description=outcome.description,
        metadata=as_metadata(outcome.metadata if metadata is None else metadata),
    )


def latest_path_or_none(context, key: AssetKey) -> Path | None:
    event = context.instance.get_latest_materialization_event(key)
    return None if event is None else Path(event.asset_materialization.metadata["artifact_dir"].value)


def contamination_check(pipeline: Pipeline, report: Evaluate):
    """The report's evaluation rows against the pipeline's training splits (engine/pipeline/contamination.py), as a
    blocking check on the merged model the report measures: it runs once every dataset is made and every stage has
    trained (a synthesized dataset exists only then), and a failure stops the report. Its settings are the report
    stage's in this run (a profile's or the launchpad's values included)."""
    datasets = evaluation_datasets(pipeline, report)  # the training ones among them
    merged = pipeline.upstream(report.name)[0]

    @asset_check(
        asset=stage_key(pipeline, merged),
        name=f"{report.name}_not_contaminated",
        blocking=True,
        additional_deps=[stage_key(pipeline, name) for name in datasets],
        description=f"No row {report.name} or a training stage scores on (held-out splits, skills items) shares "
        f"{report.contamination_ngram} words in a row with a training split of another dataset; "
        + ("allow_contamination: true makes it a warning." if report.allow_contamination else "blocks the report."),
    )
    def _not_contaminated(context) -> AssetCheckResult:
        settings = run_settings(pipeline, context.run.run_config)[report.name]
        artifacts = {name: latest_path_or_none(context, stage_key(pipeline, name)) for name in datasets}
        outcome = judge_contamination(pipeline, settings, artifacts)
        context.log.info(
            f"contamination: {outcome.metadata['evaluation_rows_checked']} evaluation rows against "
            f"{outcome.metadata['training_rows']} training rows in {outcome.metadata['contamination_seconds']} s"
        )
        return _check_result(outcome)

    return _not_contaminated


def build_checks(pipeline: Pipeline) -> list:
    """Every check of every stage of the pipeline, as its kind declares them."""
    checks = []
    for stage in pipeline.stages:
        checks += asset_checks(AssetKey([pipeline.name, stage.name]), catalog.kind_of(stage).checks(stage))
        if pipeline.role_of(stage) == "evaluate":  # the report: what it measures must not have been trained on
            checks.append(contamination_check(pipeline, stage))
    return checks
