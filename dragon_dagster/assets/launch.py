"""Materialize a whole pipeline in-process on the current Dagster instance (the demo, and tests)."""

from __future__ import annotations

from pathlib import Path

from dagster import AssetSelection, DagsterInstance, RunConfig, materialize

from ..engine.pipeline_spec import Pipeline, discover
from .factory import build_pipeline_defs


def profile_run_config(pipeline: Pipeline, profile: str | None) -> RunConfig:
    overrides = pipeline.profile(profile) if profile else {}
    return RunConfig(ops={f"{pipeline.name}__{stage}": values for stage, values in overrides.items()})


def find_pipeline(name: str, dirs: list[Path] | None = None) -> Pipeline:
    pipelines = {p.name: p for p in discover(dirs)}
    if name not in pipelines:
        raise ValueError(f"no pipeline named {name!r}; found {sorted(pipelines)}")
    return pipelines[name]


def materialize_pipeline(name: str, profile: str | None = None, dirs: list[Path] | None = None,
                         resources: dict | None = None, instance: DagsterInstance | None = None,
                         extra_config: dict | None = None) -> dict:
    from ..definitions import default_resources

    pipeline = find_pipeline(name, dirs)
    parts = build_pipeline_defs(pipeline)
    run_config = profile_run_config(pipeline, profile)
    ops = {op: {"config": values} for op, values in (run_config.ops or {}).items()}
    for op, values in (extra_config or {}).items():
        ops.setdefault(op, {"config": {}})["config"].update(values)
    instance = instance or DagsterInstance.get()
    names = [*pipeline.datasets, *(s.name for s in pipeline.stages)]
    selection = AssetSelection.assets(*[[pipeline.name, n] for n in names])
    result = materialize(parts["assets"] + parts["asset_checks"], instance=instance,
                         resources=resources or default_resources(), selection=selection,
                         run_config={"ops": ops, "loggers": {"console": {"config": {"log_level": "INFO"}}}},
                         raise_on_error=False)
    stats = {s.step_key: s for s in instance.get_run_step_stats(result.run_id)}
    artifacts = {}
    for event in result.get_asset_materialization_events():
        materialization = event.event_specific_data.materialization
        artifacts[materialization.asset_key.path[-1]] = materialization.metadata["artifact_dir"].value
    stages = []
    for stage_name in [*pipeline.datasets, *(s.name for s in pipeline.stages)]:
        stat = stats.get(f"{pipeline.name}__{stage_name}")
        seconds = (stat.end_time - stat.start_time) if stat and stat.end_time and stat.start_time else 0.0
        stages.append({"asset": f"{pipeline.name}/{stage_name}", "seconds": seconds,
                       "status": stat.status.value if stat and stat.status else "NOT RUN",
                       "artifact": artifacts.get(stage_name)})
    checks = [{"name": e.check_name, "passed": e.passed} for e in result.get_asset_check_evaluations()]
    report = next((artifacts[s.name] for s in pipeline.stages if s.kind == "evaluate" and s.name in artifacts), None)
    return {"success": result.success, "run_id": result.run_id, "stages": stages, "checks": checks,
            "report": report, "artifacts": artifacts}
