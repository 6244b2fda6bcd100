"""Asset checks: each stage kind declares its checks as plain data (engine/config/checks.py: a name, a
description, how to judge the artifact); here each becomes a Dagster asset check on the stage's asset, judged on
its latest materialization. A passing check that asks for it makes the merged model it names the champion."""

from __future__ import annotations

from pathlib import Path

from dagster import AssetCheckResult, AssetCheckSeverity, AssetKey, asset_check

from ..engine import catalog
from ..engine.config.checks import CheckSpec
from ..engine.pipeline import Pipeline
from ..resources import MLflowTracking
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
    return AssetCheckResult(
        passed=outcome.passed,
        severity=SEVERITY[outcome.severity],
        description=outcome.description,
        metadata=as_metadata(metadata),
    )


def build_checks(pipeline: Pipeline) -> list:
    """Every check of every stage of the pipeline, as its kind declares them."""
    checks = []
    for stage in pipeline.stages:
        checks += asset_checks(AssetKey([pipeline.name, stage.name]), catalog.kind_of(stage).checks(stage))
    return checks
