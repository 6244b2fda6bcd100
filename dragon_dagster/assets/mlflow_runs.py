"""How a Dagster run appears in MLflow: one parent run per Dagster run (named after it, tagged with its profile
and sweep point) with each stage's run nested under it, and a sweep's pipeline runs nested under one sweep run.
So MLflow's runs table lists pipeline runs, each expanding into its stages, and two pipeline runs (two configs,
two retrainings, two sweep points) compare side by side."""

from __future__ import annotations

import json

from dagster import AssetKey

from ..engine.pipeline import Pipeline
from ..resources.tracking_records import flatten
from .launchpad import run_settings
from .sweep_tags import POINT_TAG as SWEEP_POINT_TAG
from .sweep_tags import SETTINGS_TAG as SWEEP_SETTINGS_TAG
from .sweep_tags import SWEEP_TAG

PROFILE_TAG = "dragon/profile"  # on a Dagster run: the pipeline profile its config came from


def dagster_tags(context) -> dict[str, str]:
    """The Dagster run's own dragon/ tags (profile, sweep, feedback range...), as they are."""
    return {k: v for k, v in context.run.tags.items() if k.startswith("dragon/")}


def sweep_run(context, pipeline: Pipeline, tracking) -> str | None:
    """The sweep's parent run, when this Dagster run is a point of one. No process lives as long as a sweep (its
    points are separate Dagster runs, queued or run in turn), so the run is ended as soon as a point has found it:
    FINISHED, its end time the latest point's start, never left RUNNING in the dashboards."""
    sweep = context.run.tags.get(SWEEP_TAG)
    if not sweep:
        return None
    run_id = tracking.parent_run(
        pipeline.name,
        {"sweep": sweep, "level": "sweep"},
        run_name=f"sweep {sweep.split('/', 1)[-1]}",
        tags={"pipeline": pipeline.name},
        params={},
        description=f"Sweep `{sweep}` of the {pipeline.name} pipeline: each nested run is one point.",
        artifact=("sweep.json", json.dumps({"sweep": sweep, "pipeline": pipeline.name}, indent=2)),
    )
    tracking.end_run(run_id)
    return run_id


def settings_params(pipeline: Pipeline, run) -> dict[str, str]:
    """The pipeline run's params: every stage's effective settings in the Dagster run (those of the stages it
    selected), flattened as `<stage>.<setting>` (`dpo_adapter.beta`, `sft_adapter.args.learning_rate`) and each
    value as its type writes it (a list as JSON), so MLflow's compare view with "show diff only" on two pipeline
    runs lists the settings that differ and nothing else."""
    selected = run.asset_selection
    out: dict[str, str] = {}
    for name, stage in run_settings(pipeline, run.run_config).items():
        if selected and AssetKey([pipeline.name, name]) not in selected:  # none: the whole job
            continue
        values = stage.model_dump(mode="json", exclude={"name"})
        out.update(flatten(name, _lists_as_json(values)))
    return out


def _lists_as_json(values: dict) -> dict:
    return {
        k: _lists_as_json(v) if isinstance(v, dict) else json.dumps(v) if isinstance(v, list) else v
        for k, v in values.items()
    }


def pipeline_run(context, pipeline: Pipeline, tracking) -> str:
    """The MLflow run of this Dagster run (created by its first step that logs to MLflow), marked running."""
    run = context.run
    tags = dagster_tags(context)
    profile = tags.get(PROFILE_TAG, "")
    settings = json.loads(tags.get(SWEEP_SETTINGS_TAG, "{}") or "{}")
    label = f"point {tags[SWEEP_POINT_TAG]}" if SWEEP_POINT_TAG in tags else (profile or "run")
    return tracking.parent_run(
        pipeline.name,
        {"dagster_run_id": run.run_id, "level": "pipeline"},
        # a profile's own job names its profile already
        run_name=f"{run.job_name}{'' if run.job_name.endswith(f'_{label}') else f' {label}'} {run.run_id[:8]}",
        tags={"pipeline": pipeline.name, "dagster_job": run.job_name, "profile": profile or None, **tags},
        params={"model": pipeline.model, "profile": profile or "none", **settings, **settings_params(pipeline, run)},
        description=(pipeline.description or f"The {pipeline.name} pipeline.")
        + f"\n\nDagster run `{run.run_id}` of job `{run.job_name}`"
        + (f", profile `{profile}`" if profile else "")
        + ". Its stages' runs are nested under this one.",
        parent=lambda: sweep_run(context, pipeline, tracking),  # asked only when this run is created
        artifact=("pipeline.json", json.dumps(pipeline.model_dump(mode="json"), indent=2, default=str)),
    )


def log_step(tracking, run_id: str, parent: str, stage: str, step: int, values: dict) -> None:
    """A training step's figures on the stage's run, and on the pipeline run under `<stage>/` (`sft_adapter/
    train/loss`): MLflow's chart view draws the first 10 runs of its table, where the pipeline runs come first and
    their stages' runs after, so each stage's curves are also where that view draws them, a section per stage."""
    tracking.log_metrics(run_id, values, step, finite_only=False)
    tracking.log_metrics(parent, {f"{stage}/{key}": value for key, value in values.items()}, step, finite_only=False)


def stage_source(context) -> str:
    """The Source column of a stage's run: the Dagster job and asset that ran it."""
    return f"dagster: {context.run.job_name} / {context.asset_key.to_user_string()}"
