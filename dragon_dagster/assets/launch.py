"""Materialize a whole pipeline in-process on the current Dagster instance (the demo, and tests), and find a
pipeline among the loaded definitions by name."""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path

from dagster import AssetKey, DagsterInstance, Definitions, RunConfig

from ..engine.pipeline import Pipeline
from .console_log import console_logger
from .factory import PIPELINE_METADATA, build_pipeline_defs, job_name
from .mlflow_runs import PROFILE_TAG

DEFAULT_MODULE = "dragon_dagster.definitions"


def profile_run_config(pipeline: Pipeline, profile: str | None) -> RunConfig:
    overrides = pipeline.profile(profile) if profile else {}
    return RunConfig(ops={f"{pipeline.name}__{stage}": values for stage, values in overrides.items()})


def project_module(cwd: Path | None = None) -> str:
    """The definitions module of the Dagster project in cwd (pyproject's [tool.dagster] module_name or
    [tool.dg.project] root_module + .definitions), else this package's."""
    pyproject = (cwd or Path.cwd()) / "pyproject.toml"
    if pyproject.exists():
        tool = tomllib.loads(pyproject.read_text()).get("tool", {})
        if tool.get("dagster", {}).get("module_name"):
            return tool["dagster"]["module_name"]
        root = tool.get("dg", {}).get("project", {}).get("root_module")
        if root:
            return f"{root}.definitions"
    return DEFAULT_MODULE


def load_definitions(module: str | None = None) -> Definitions:
    loaded = importlib.import_module(module or project_module())
    defs = getattr(loaded, "defs", None)
    if defs is None:  # a dg project: `@dg.definitions def defs()` in the module
        raise ValueError(f"{module}: no `defs` in the module")
    return defs() if callable(defs) and not isinstance(defs, Definitions) else defs


def pipelines_in(defs: Definitions) -> dict[str, Pipeline]:
    """Every pipeline whose job is in the definitions, by name."""
    found = {}
    for job in defs.jobs or []:
        pipeline = pipeline_of_job(getattr(job, "metadata", None))
        if pipeline is not None:
            found[pipeline.name] = pipeline
    return found


def pipeline_of_job(metadata) -> Pipeline | None:
    """The pipeline a job was built from, by its metadata (a job definition's, or a code location's remote
    job's); None for a job of no pipeline."""
    entry = (metadata or {}).get(PIPELINE_METADATA)
    if entry is None:
        return None
    value = entry.value if hasattr(entry, "value") else entry
    return Pipeline.model_validate(value["settings"]).located(value["source_file"])


def find_pipeline(name: str, defs: Definitions | None = None) -> Pipeline:
    pipelines = pipelines_in(defs if defs is not None else load_definitions())
    if name not in pipelines:
        raise ValueError(f"no pipeline named {name!r} in the loaded definitions; found {sorted(pipelines)}")
    return pipelines[name]


def materialize_pipeline(
    pipeline: Pipeline,
    profile: str | None = None,
    resources: dict | None = None,
    instance: DagsterInstance | None = None,
    extra_config: dict | None = None,
    only: list[str] | None = None,
    tags: dict[str, str] | None = None,
    log_level: str = "WARNING",
) -> dict:
    """only: the names of the assets to materialize (default: every one of the pipeline's job). log_level: the
    records the terminal shows besides a line per stage (console_log.py; INFO: each training step's)."""
    from ..resources import default_resources

    parts = build_pipeline_defs(pipeline)
    run_config = profile_run_config(pipeline, profile)
    ops = {op: {"config": values} for op, values in (run_config.ops or {}).items()}
    for op, values in (extra_config or {}).items():
        ops.setdefault(op, {"config": {}})["config"].update(values)
    instance = instance or DagsterInstance.get()
    names = [*pipeline.datasets, *(s.name for s in pipeline.stages)]
    defs = Definitions(**parts, resources=resources or default_resources(), loggers={"console": console_logger})
    result = defs.resolve_job_def(job_name(pipeline, profile)).execute_in_process(
        run_config={"ops": ops, "loggers": {"console": {"config": {"log_level": log_level}}}},
        instance=instance,
        raise_on_error=False,
        # the profile is shown on the run, its MLflow run and its assets
        tags={**({PROFILE_TAG: profile} if profile else {}), **(tags or {})} or None,
        asset_selection=[AssetKey([pipeline.name, name]) for name in only] if only else None,
    )
    stats = {s.step_key: s for s in instance.get_run_step_stats(result.run_id)}
    artifacts, reused = {}, {}
    for event in result.get_asset_materialization_events():
        materialization = event.event_specific_data.materialization
        artifacts[materialization.asset_key.path[-1]] = materialization.metadata["artifact_dir"].value
        if materialization.metadata.get("reused") and materialization.metadata["reused"].value:
            reused[materialization.asset_key.path[-1]] = materialization.metadata["reused_from_run"].value
    stages = []
    for stage_name in names:
        stat = stats.get(f"{pipeline.name}__{stage_name}")
        seconds = (stat.end_time - stat.start_time) if stat and stat.end_time and stat.start_time else 0.0
        stages.append(
            {
                "asset": f"{pipeline.name}/{stage_name}",
                "seconds": seconds,
                "status": stat.status.value if stat and stat.status else "NOT RUN",
                "artifact": artifacts.get(stage_name),
                "reused_from_run": reused.get(stage_name),  # the run that made the artifact it points at
            }
        )
    checks = [
        {
            "name": e.check_name,
            "asset": e.asset_key.to_user_string(),
            "passed": e.passed,
            "severity": e.severity.value,
            "description": e.description,  # a failure's reason and fix, as the UI shows it with the check
        }
        for e in result.get_asset_check_evaluations()
    ]
    report = next(
        (artifacts[s.name] for s in pipeline.stages if pipeline.role_of(s) == "evaluate" and s.name in artifacts), None
    )
    return {
        "success": result.success,
        "run_id": result.run_id,
        "stages": stages,
        "checks": checks,
        "report": report,
        "artifacts": artifacts,
    }
