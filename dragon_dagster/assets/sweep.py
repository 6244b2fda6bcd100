"""A sweep's points as Dagster runs: one run of the pipeline's job `<pipeline>_pipeline` per point, submitted to
the instance's run queue (dagster.yaml: the queued run coordinator), so the points wait there, with no process,
and take the `training` pool one at a time like any other training run; `dagster dev` (`make ui`) runs them.

A point is a run with run tags, not a partition: the points are settings, not slices of data; a partition
would make each point a materialization of its own asset keys, while the points should all be what they are,
materializations of the same assets with different run config, that `dragon compare` ranks afterwards. The
tags: `dragon/sweep` = <pipeline>/<sweep>/<sweep id> (one value per submission, so the UI's run list filters a
sweep by it), `dragon/sweep_point` = the point's index and `dragon/sweep_settings` = its settings as JSON.
Each stage's MLflow run carries the same tags (training.py, report.py).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dagster import DagsterInstance, DagsterRun, RunsFilter

from ..engine.config.settings import value_at
from ..engine.config.stage import Stage
from ..engine.pipeline import Pipeline
from ..engine.pipeline.sweeps import best_point
from ..engine.runs import stage_run_metrics
from .factory import overrides_run_config
from .launch import DEFAULT_MODULE, materialize_pipeline, pipeline_of_job
from .launchpad import run_settings
from .mlflow_runs import PROFILE_TAG
from .pool import TRAINING_POOL
from .sweep_tags import POINT_TAG, RANK_TAG, SETTINGS_TAG, SWEEP_TAG


@dataclass
class SweepPoint:
    index: int
    settings: dict[str, Any]  # {`stage.setting`: value}, as the sweep lists it (and its run tag holds it)
    run_config: dict[str, Any]
    tags: dict[str, str]
    stages: dict[str, Stage]  # every stage's settings model at this point, as its asset will compute them

    def value(self, key: str) -> Any:
        """A setting at this point by `<stage>.<path of fields>`, typed as the stage's model holds it."""
        stage, _, path = key.partition(".")
        return value_at(self.stages[stage], path)


def sweep_points(pipeline: Pipeline, name: str, sweep_id: str) -> list[SweepPoint]:
    """Each point's run config (its overrides, over the sweep's profile, as a profile becomes run config) and
    run tags."""
    sweep, points = pipeline.sweep(name), []
    rank = json.dumps({"metric": sweep.metric, "goal": sweep.goal, "stage": pipeline.sweep_stage(name)})
    for index, settings in enumerate(sweep.settings()):
        run_config = overrides_run_config(pipeline, pipeline.sweep_overrides(name, settings))
        tags = {
            SWEEP_TAG: sweep_tag(pipeline.name, name, sweep_id),
            POINT_TAG: str(index),
            SETTINGS_TAG: json.dumps(settings),
            RANK_TAG: rank,
            **({PROFILE_TAG: sweep.profile} if sweep.profile else {}),
        }
        points.append(SweepPoint(index, settings, run_config, tags, run_settings(pipeline, run_config)))
    return points


def sweep_tag(pipeline: str, name: str, sweep_id: str) -> str:
    return f"{pipeline}/{name}/{sweep_id}"


def new_sweep_id() -> str:
    return uuid.uuid4().hex[:8]


def workspace_target(root: Path | None = None):
    """The code location as `dagster dev` run in root loads it (pyproject's [tool.dagster], else workspace.yaml,
    else this package's definitions), so a queued run names the location the daemon knows."""
    import tomllib

    from dagster._core.workspace.load_target import ModuleTarget, PyProjectFileTarget, WorkspaceFileTarget

    root = Path(root or Path.cwd())
    pyproject = root / "pyproject.toml"
    if pyproject.exists() and "dagster" in tomllib.loads(pyproject.read_text()).get("tool", {}):
        return PyProjectFileTarget(str(pyproject))
    if (root / "workspace.yaml").exists():
        return WorkspaceFileTarget(paths=[str(root / "workspace.yaml")])
    return ModuleTarget(
        module_name=DEFAULT_MODULE, attribute=None, working_directory=str(root), location_name="dragon_dagster"
    )


def submit_sweep(
    instance: DagsterInstance, pipeline_name: str, name: str, root: Path | None = None, sweep_id: str | None = None
) -> tuple[Pipeline, str, list[tuple[SweepPoint, str]]]:
    """Submit every point of sweep `name` of pipeline `pipeline_name` to the instance's run queue, as
    `dagster job launch` does (the job from the code location the daemon runs it from). Returns the pipeline
    (as that code location has it), the sweep's tag value and (point, run id) pairs."""
    from dagster import __version__
    from dagster._cli.job import _create_run
    from dagster._core.workspace.context import WorkspaceProcessContext

    sweep_id = sweep_id or new_sweep_id()
    job_name = f"{pipeline_name}_pipeline"
    # The run queue sets a pool's limit the first time a queued run needs it, but counts it only from its next
    # pass: on an instance that has not seen the pool yet, every point would start at once. Set it first.
    instance.event_log_storage.initialize_concurrency_limit_to_default(TRAINING_POOL)
    with WorkspaceProcessContext(instance, workspace_target(root), version=__version__) as process:
        workspace = process.create_request_context()
        found = []
        for location_name in workspace.code_location_names:
            if workspace.has_code_location_error(location_name):
                continue
            location = workspace.get_code_location(location_name)
            for repo in location.get_repositories().values():
                if repo.has_job(job_name):
                    found.append((location, repo, repo.get_full_job(job_name)))
        if not found:
            errors = {n: str(workspace.get_code_location_error(n)) for n in workspace.code_location_names}
            raise ValueError(
                f"no job {job_name!r} in the code locations {workspace.code_location_names}"
                + (f"; locations that did not load: {errors}" if any(errors.values()) else "")
            )
        location, repo, job = found[0]
        pipeline = pipeline_of_job(job.metadata)
        submitted = []
        for point in sweep_points(pipeline, name, sweep_id):
            run = _create_run(
                instance=instance,
                code_location=location,
                remote_repo=repo,
                remote_job=job,
                run_config=point.run_config,
                tags=point.tags,
                op_selection=None,
                run_id=None,
            )
            instance.submit_run(run.run_id, workspace)
            submitted.append((point, run.run_id))
    return pipeline, sweep_tag(pipeline.name, name, sweep_id), submitted


def run_sweep_here(
    pipeline: Pipeline, name: str, instance: DagsterInstance, resources: dict | None = None, sweep_id: str | None = None
) -> tuple[str, list[tuple[SweepPoint, dict]]]:
    """Run every point one after another in this process (as `dragon demo` runs a pipeline), not through the
    queue: the same run config and tags, no daemon needed. Returns the sweep's tag value and (point, outcome)."""
    sweep_id = sweep_id or new_sweep_id()
    done = []
    for point in sweep_points(pipeline, name, sweep_id):
        ops = {op: values["config"] for op, values in point.run_config["ops"].items()}
        done.append((point, materialize_pipeline(pipeline, None, resources, instance, ops, tags=point.tags)))
    return sweep_tag(pipeline.name, name, sweep_id), done


def sweep_runs(instance: DagsterInstance, pipeline: str, ref: str | None = None) -> tuple[str, list[DagsterRun]]:
    """The runs of one sweep of a pipeline, by point: ref is a sweep id or a sweep's name (its latest submission);
    None: the pipeline's latest sweep. Returns the sweep's tag value and its runs."""
    runs = instance.get_runs(RunsFilter(job_name=f"{pipeline}_pipeline"))  # newest first
    runs = [r for r in runs if r.tags.get(SWEEP_TAG, "").startswith(f"{pipeline}/")]
    if ref is not None:
        runs = [r for r in runs if ref in r.tags[SWEEP_TAG].split("/")[1:]]
    if not runs:
        which = f"no sweep {ref!r}" if ref else "no sweep"
        raise ValueError(f"{which} of pipeline {pipeline!r} in the Dagster instance ({instance.root_directory})")
    tag = runs[0].tags[SWEEP_TAG]
    points = [r for r in runs if r.tags[SWEEP_TAG] == tag]
    return tag, sorted(points, key=lambda r: int(r.tags.get(POINT_TAG, 0)))


def sweep_comparison(instance: DagsterInstance, tracking_uri: str, pipeline: str, ref: str | None = None) -> dict:
    """One row per point of a sweep: its settings, its metric (from the MLflow run of the evaluate stage that its
    Dagster run made), the Dagster run's status and id; and the best point by the sweep's metric and goal."""
    tag, runs = sweep_runs(instance, pipeline, ref)
    rank = json.loads(runs[0].tags[RANK_TAG])
    rows = []
    for run in runs:
        found = stage_run_metrics(tracking_uri, pipeline, run.run_id, rank["stage"])
        rows.append(
            {
                "point": int(run.tags[POINT_TAG]),
                "settings": json.loads(run.tags[SETTINGS_TAG]),
                "metric": (found or {}).get("metrics", {}).get(rank["metric"]),
                "status": run.status.value,
                "dagster_run_id": run.run_id,
                "mlflow_run_id": (found or {}).get("run_id"),
            }
        )
    return {"sweep": tag, **rank, "rows": rows, "best": best_point(rows, rank["goal"])}
