"""Reuse instead of retraining: a stage whose version and inputs match an artifact it already made points at that
artifact rather than making it again.

A stage's version (engine/pipeline/versions.py) is computed from the settings the run uses (the YAML, its profile
and the launchpad's config), and its inputs are the artifact directories its upstream assets handed it. Since
artifacts are immutable and an upstream stage that is reused hands on the same directory, equal versions and equal
inputs mean the same work: the materialization then records the earlier artifact (`reused_from_run` names the run
that made it, and the figures are that materialization's), and a run whose every stage is reused trains nothing.
A run tagged `dragon/fresh=true` (`dragon demo --fresh`, or the tag in the launchpad) makes every stage anew.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

from dagster import BetaWarning, DataVersion, MetadataValue, Output

from ..engine.pipeline import Pipeline
from ..engine.pipeline.versions import stage_version

REUSED_TAG = "dragon/reused_from"  # a reused stage's materialization: the Dagster run that made its artifact
FRESH_TAG = "dragon/fresh"  # "true": make every stage of the run anew, whatever was made before
VERSION_KEY = "settings_version"  # the materialization's: the stage's version with the run's own settings
INPUTS_KEY = "inputs"  # the artifact directories it read, by input name
LOOKBACK = 20  # of a stage's materializations, the newest ones searched for a match


def _output(value: str, metadata: dict, data_version: DataVersion, tags: dict[str, str] | None = None) -> Output:
    # Output's data_version is how an asset gives its materialization its own data version (Dagster's documented
    # way); its beta notice is for whoever writes definitions, and would print once per stage of every run.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BetaWarning)
        return Output(value, metadata=metadata, data_version=data_version, tags=tags)


def artifact_version(artifact: str | Path) -> DataVersion:
    """A materialization's data version: the artifact it points at (its directory's name, unique to the run that
    made it). A reused stage hands on the same one, so what reads it stays in sync; a stage made anew hands on
    another, so what reads it is unsynced until made from it, which is exactly when its inputs no longer match."""
    return DataVersion(Path(artifact).name)


def fresh(context) -> bool:
    return str(context.run.tags.get(FRESH_TAG, "")).lower() in ("1", "true", "yes")


def _value(entry):
    return entry.value if hasattr(entry, "value") else entry


def _wanted(inputs: dict[str, str]) -> dict[str, str]:
    """The inputs as a materialization records them (and a later run compares them)."""
    return {name: str(path) for name, path in sorted(inputs.items())}


def _tag_pipeline_run(context, pipeline: Pipeline, tracking, tags: dict[str, str]) -> None:
    """Tags on the pipeline's MLflow run (found or made, set running), which is ended again: the next stage that
    logs sets it running and ends it."""
    from .mlflow_runs import pipeline_run

    parent = pipeline_run(context, pipeline, tracking)
    with tracking.owning(parent):
        for key, value in tags.items():
            tracking.client().set_tag(parent, key, value)


def reusable(context, inputs: dict[str, str], version: str) -> Output[str] | None:
    """The earlier materialization of this asset that made the same thing (the same version, the same input
    artifacts, its directory still there), as this run's output; None when there is none or the run asks for a
    fresh one."""
    if fresh(context):
        return None
    wanted = _wanted(inputs)
    found = context.instance.fetch_materializations(context.asset_key, limit=LOOKBACK)
    for record in found.records:
        metadata = record.asset_materialization.metadata
        if _value(metadata.get(VERSION_KEY)) != version or _value(metadata.get(INPUTS_KEY)) != wanted:
            continue
        artifact = _value(metadata.get("artifact_dir"))
        if not artifact or not (Path(artifact) / "manifest.json").is_file():
            continue  # removed since: made again
        made_by = _value(metadata.get("reused_from_run")) or record.run_id
        context.log.info(f"{context.asset_key.to_user_string()}: reused {artifact} (made by run {made_by})")
        return _output(
            str(artifact),
            {**metadata, "reused": True, "reused_from_run": made_by},
            artifact_version(artifact),
            tags={REUSED_TAG: made_by},  # on the materialization, where the asset's events show it
        )
    return None


def versioned(out: Output, inputs: dict[str, str], version: str) -> Output:
    """A stage's fresh output with what a later run compares to reuse it: its version and its inputs."""
    metadata = {
        **(out.metadata or {}),
        VERSION_KEY: version,
        INPUTS_KEY: MetadataValue.json(_wanted(inputs)),
        "reused": False,
    }
    return _output(out.value, metadata, artifact_version(out.value))


def code_version(context) -> str | None:
    """The asset's code version as Dagster has it (its stage's version with the YAML's settings): the one version
    of the stage that the Dagster UI, `dragon status` and the pipeline's MLflow run (`version.<stage>`) show."""
    return context.assets_def.code_versions_by_key.get(context.asset_key)


def reuse_or_make(
    context,
    pipeline: Pipeline,
    settings,
    inputs: dict[str, str],
    make: Callable[[], Output],
    tracking=None,
    version: str | None = None,
    allow: bool = True,
) -> Output:
    """The earlier artifact when one matches (reusable), else make(), versioned. tracking: where the pipeline's
    MLflow run records each stage's version and the stages reused. version: the stage's version when it is not its
    settings' (a source file's content). allow: False where a run must make it anew whatever the versions say
    (resuming from a checkpoint)."""
    version = version or stage_version(pipeline, settings)
    out = reusable(context, inputs, version) if allow else None
    reused = out is not None
    if not reused:
        out = versioned(make(), inputs, version)
    if tracking is not None:
        name = context.asset_key.path[-1]
        tags = {f"version.{name}": code_version(context) or version}
        if reused:
            tags[f"reused.{name}"] = str(_value(out.metadata["reused_from_run"]))
        _tag_pipeline_run(context, pipeline, tracking, tags)
    return out
