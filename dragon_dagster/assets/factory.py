"""Turn a pipeline into Dagster definitions: its assets (builders.py), the checks its stage kinds declare
(checks.py), its job, and the retraining from feedback when it has a `feedback:` section (retraining.py)."""

from __future__ import annotations

from dagster import AssetSelection, MetadataValue, define_asset_job

from ..engine.pipeline import Pipeline
from .builders import BUILDERS, key, source_asset
from .checks import build_checks
from .pool import POOL_EXECUTOR
from .retraining import build_feedback_defs

PIPELINE_METADATA = "dragon/pipeline"  # on each pipeline's job: its effective settings and source file


def build_pipeline_defs(pipeline: Pipeline) -> dict:
    """Assets, asset checks, jobs, sensors and schedules of one pipeline."""
    assets = [source_asset(pipeline, name, spec) for name, spec in pipeline.datasets.items()]
    assets += [BUILDERS[pipeline.role_of(stage)](pipeline, stage) for stage in pipeline.stages]
    names = [*pipeline.datasets, *(s.name for s in pipeline.stages)]
    job = define_asset_job(
        f"{pipeline.name}_pipeline",
        selection=AssetSelection.assets(*[key(pipeline, n) for n in names]),
        description=pipeline.description or f"Every stage of the {pipeline.name} pipeline.",
        executor_def=POOL_EXECUTOR,
        metadata={
            PIPELINE_METADATA: MetadataValue.json(
                {"settings": pipeline.model_dump(mode="json"), "source_file": pipeline.source_file}
            ),
            **sweeps_note(pipeline),
        },
    )
    parts = {"assets": assets, "asset_checks": build_checks(pipeline), "jobs": [job], "sensors": [], "schedules": []}
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
