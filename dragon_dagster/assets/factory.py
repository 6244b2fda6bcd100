"""Turn a pipeline into Dagster definitions: its assets (builders.py), the checks its stage kinds declare
(checks.py), its job, and the retraining from feedback when it has a `feedback:` section (retraining.py)."""

from __future__ import annotations

from dagster import AssetSelection, MetadataValue, define_asset_job

from ..engine.pipeline import Pipeline
from .asset_wiring import key
from .builders import BUILDERS
from .checks import build_checks
from .data_assets import source_asset
from .mlflow_runs import PROFILE_TAG
from .pool import POOL_EXECUTOR
from .retraining import build_feedback_defs

PIPELINE_METADATA = "dragon/pipeline"  # on each pipeline's job: its effective settings and source file


def overrides_run_config(pipeline: Pipeline, overrides: dict[str, dict]) -> dict:
    """Per-stage overrides (a profile's, a sweep point's) as the run config of the pipeline's job."""
    return {"ops": {f"{pipeline.name}__{stage}": {"config": values} for stage, values in overrides.items()}}


def job_name(pipeline: Pipeline, profile: str | None = None) -> str:
    """The pipeline's job a run with this profile is listed under in the UI (never an ephemeral job): the profile's
    own (profile_jobs), whose launchpad opens on the profile's values, so opening the launchpad after
    `dragon demo` starts from what the demo ran; the pipeline's job, on the YAML's values, without a profile."""
    return f"{pipeline.name}_{profile}" if profile else f"{pipeline.name}_pipeline"


def profile_jobs(pipeline: Pipeline, selection) -> list:
    """One job per profile, `<pipeline>_<profile>`: its launchpad opens on the profile's values (the pipeline's
    own job shows the YAML's), and its runs carry the dragon/profile tag the MLflow runs and assets show."""
    return [
        define_asset_job(
            job_name(pipeline, profile),
            selection=selection,
            description=f"Every stage of the {pipeline.name} pipeline with the `{profile}` profile's settings "
            "(the launchpad starts from them).",
            executor_def=POOL_EXECUTOR,
            config=overrides_run_config(pipeline, overrides),
            tags={PROFILE_TAG: profile},
        )
        for profile, overrides in pipeline.profiles.items()
    ]


def build_pipeline_defs(pipeline: Pipeline) -> dict:
    """Assets, asset checks, jobs, sensors and schedules of one pipeline."""
    assets = [source_asset(pipeline, name, spec) for name, spec in pipeline.datasets.items()]
    assets += [BUILDERS[pipeline.role_of(stage)](pipeline, stage) for stage in pipeline.stages]
    names = [*pipeline.datasets, *(s.name for s in pipeline.stages)]
    selection = AssetSelection.assets(*[key(pipeline, n) for n in names])
    job = define_asset_job(
        job_name(pipeline),
        selection=selection,
        description=pipeline.description or f"Every stage of the {pipeline.name} pipeline.",
        executor_def=POOL_EXECUTOR,
        metadata={
            PIPELINE_METADATA: MetadataValue.json(
                {"settings": pipeline.model_dump(mode="json"), "source_file": pipeline.source_file}
            ),
            **sweeps_note(pipeline),
        },
    )
    parts = {
        "assets": assets,
        "asset_checks": build_checks(pipeline),
        "jobs": [job, *profile_jobs(pipeline, selection)],
        "sensors": [],
        "schedules": [],
    }
    if pipeline.feedback is not None:
        for name, values in build_feedback_defs(pipeline).items():
            parts[name] += values
    return parts


def sweeps_note(pipeline: Pipeline) -> dict:
    """The job's note of its sweeps in the UI: each one's points and the command that submits them."""
    if not pipeline.sweeps:
        return {}
    lines = [
        f"- **{name}**: {len(sweep.settings())} points over {', '.join(sweep.over)}, ranked by {sweep.metric} "
        f"({sweep.goal}): `dragon sweep {pipeline.name} {name}`, then `dragon compare {pipeline.name} --sweep {name}`"
        for name, sweep in pipeline.sweeps.items()
    ]
    return {"dragon/sweeps": MetadataValue.md("\n".join(lines))}
