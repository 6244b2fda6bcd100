"""Sweeps end to end (issue 26): `dragon sweep` submits one run of the pipeline's job per point to the run queue of a
real instance (the shipped dagster.yaml); `dragon sweep --here` runs the points in-process; `dragon compare --sweep`
names the point whose evaluation logged the best metric in MLflow. That queued runs wait for the training pool is
tests/assets/test_run_queue.py's (a sweep's points are plain runs of the pipeline's job)."""

import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

from dragon_dagster.assets.sweep import sweep_points
from dragon_dagster.assets.sweep_tags import POINT_TAG, SETTINGS_TAG, SWEEP_TAG
from dragon_dagster.cli import PROJECT_DAGSTER_YAML, main
from dragon_dagster.engine.pipeline import load
from tests.support import component_yaml, user_project

REPO = Path(__file__).resolve().parents[2]
# Three learning rates far apart, so the points' held-out losses differ and the ranking means something.
PIPELINE = """\
name: tiny
model: {model}
datasets:
  tickets: {{path: "example:tickets.csv"}}
stages:
  - {{name: sft_dataset, kind: chat_dataset, source: tickets, prompt: "{{subject}}", response: reply,
      group_by: subject}}
  - {{name: sft_adapter, kind: sft, dataset: sft_dataset, n_samples: 0,
      args: {{max_steps: 4, batch_size: 4, logging_steps: 2, save_steps: 100, max_seq_len: 128}}}}
  - {{name: merged_model, kind: merge}}
  - {{name: evaluation_report, kind: evaluate, dataset: sft_dataset, n_samples: 0, n_judge: 0, max_eval_rows: 8,
      max_new_tokens: 4}}
profiles:
  quick: {{sft_adapter: {{args: {{max_steps: 3}}}}}}
sweeps:
  lr:
    over:
      sft_adapter.args.learning_rate: [1.0e-5, 3.0e-3, 3.0e-2]
    metric: eval/loss
    goal: minimize
    profile: quick
"""


def sweep_project(tmp_path, tiny_model, monkeypatch) -> tuple[Path, dict]:
    """A user's project with the tiny pipeline and its sweep, a Dagster home with the shipped dagster.yaml, and the
    environment `dragon` and Dagster's processes read."""
    project = tmp_path / "project"
    defs = user_project(project)
    (defs / "tiny").mkdir()
    (defs / "tiny" / "defs.yaml").write_text(component_yaml(PIPELINE.format(model=tiny_model)))
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(PROJECT_DAGSTER_YAML, home / "dagster.yaml")  # the queued run coordinator and the training pool
    env = {
        "DAGSTER_HOME": str(home),
        "DRAGON_RUNS_DIR": str(tmp_path / "runs"),
        "PYTHONPATH": os.pathsep.join([str(project), str(REPO), os.environ.get("PYTHONPATH", "")]),
        "HF_HUB_OFFLINE": "1",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(project)  # `dragon sweep` submits to the code location `dagster dev` would load here
    monkeypatch.syspath_prepend(str(project))
    return project, env


def logged_losses(tmp_path) -> dict:
    """eval/loss of each point as the evaluate stage logged it in MLflow, by Dagster run, read here on its own."""
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("tiny").experiment_id
    logged = {
        run.data.tags["dagster_run_id"]: run
        for run in client.search_runs([experiment], "tags.stage = 'evaluation_report'")
    }
    return {run_id: (run.data.metrics["eval/loss"], run.data.tags) for run_id, run in logged.items()}


def check_points_nest_under_their_sweep(tmp_path, tag: str) -> None:
    """Each point's pipeline run nests under the one sweep run (its parent tag is that run's id)."""
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("tiny").experiment_id
    [sweep] = client.search_runs([experiment], f"tags.level = 'sweep' and tags.sweep = '{tag}'")
    assert "mlflow.parentRunId" not in sweep.data.tags
    assert sweep.info.status == "FINISHED"  # no process outlives a point to end it later
    points = client.search_runs([experiment], "tags.level = 'pipeline'")
    assert len(points) == 3 and {r.data.tags["mlflow.parentRunId"] for r in points} == {sweep.info.run_id}
    assert {r.info.status for r in points} == {"FINISHED"}


def check_compare_names_the_best(tmp_path, tag: str, points: dict[str, int]) -> None:
    """`dragon compare --sweep` lists every point with the metric MLflow holds, and names the lowest eval/loss."""
    logged = logged_losses(tmp_path)
    losses = {run_id: loss for run_id, (loss, _) in logged.items()}
    assert set(losses) == set(points) and len(set(losses.values())) == 3, (
        losses
    )  # distinct: the ranking means something
    assert all(tags[SWEEP_TAG] == tag for _, tags in logged.values())  # the MLflow runs filter by sweep too
    check_points_nest_under_their_sweep(tmp_path, tag)
    expected = min(losses, key=losses.get)

    found = CliRunner().invoke(main, ["compare", "tiny", "--sweep", "lr", "--json"], catch_exceptions=False)
    assert found.exit_code == 0, found.output
    ranked = json.loads(found.output)
    assert ranked["sweep"] == tag and ranked["metric"] == "eval/loss" and ranked["goal"] == "minimize"
    assert [row["point"] for row in ranked["rows"]] == [0, 1, 2]
    assert {row["dagster_run_id"]: row["metric"] for row in ranked["rows"]} == losses
    assert {row["dagster_run_id"]: row["point"] for row in ranked["rows"]} == points
    assert ranked["best"]["dagster_run_id"] == expected and ranked["best"]["point"] == points[expected]

    table = CliRunner().invoke(main, ["compare", "tiny", "--sweep", tag.split("/")[-1]], catch_exceptions=False)
    assert table.exit_code == 0, table.output
    assert f"best: point {points[expected]} (sft_adapter.args.learning_rate=" in table.output
    assert f"Dagster run {expected}" in table.output


def test_sweep_submits_one_queued_run_per_point_with_its_settings(tiny_model, tmp_path, monkeypatch):
    project, _ = sweep_project(tmp_path, tiny_model, monkeypatch)
    pipeline = load(project / "trainlab" / "defs" / "tiny" / "defs.yaml")
    [first, *_] = sweep_points(pipeline, "lr", "x")  # the profile under each point, as the job's run config
    assert first.run_config == {
        "ops": {"tiny__sft_adapter": {"config": {"args": {"max_steps": 3, "learning_rate": 1e-5}}}}
    }

    out = CliRunner().invoke(main, ["sweep", "tiny", "lr"], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    with DagsterInstance.get() as instance:
        runs = instance.get_runs(RunsFilter(job_name="tiny_pipeline"))
        assert len(runs) == 3 and {r.status for r in runs} == {DagsterRunStatus.QUEUED}, out.output
        [tag] = {r.tags[SWEEP_TAG] for r in runs}
        assert tag.startswith("tiny/lr/")
        rates = {int(r.tags[POINT_TAG]): json.loads(r.tags[SETTINGS_TAG]) for r in runs}
        assert rates == {i: {"sft_adapter.args.learning_rate": lr} for i, lr in enumerate([1e-5, 3e-3, 3e-2])}
        for run in runs:  # each with its run config, and its id printed with its link in the Dagster UI
            point = int(run.tags[POINT_TAG])
            assert (
                run.run_config["ops"]["tiny__sft_adapter"]["config"]["args"]["learning_rate"]
                == rates[point]["sft_adapter.args.learning_rate"]
            )
            assert f"http://127.0.0.1:3000/runs/{run.run_id}" in out.output
        # the training pool has its limit before the queue first sees the points: they will start one at a time
        assert instance.event_log_storage.get_concurrency_info("training").slot_count == 1


@pytest.mark.slow  # three tiny pipeline runs, about 2 minutes on 2 cores
def test_sweep_here_runs_the_points_and_compare_names_the_best(tiny_model, tmp_path, monkeypatch):
    sweep_project(tmp_path, tiny_model, monkeypatch)
    out = CliRunner().invoke(main, ["sweep", "tiny", "lr", "--here"], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    with DagsterInstance.get() as instance:
        runs = instance.get_runs(RunsFilter(job_name="tiny_pipeline"))
    assert {r.status for r in runs} == {DagsterRunStatus.SUCCESS} and len(runs) == 3
    [tag] = {r.tags[SWEEP_TAG] for r in runs}
    check_compare_names_the_best(tmp_path, tag, {r.run_id: int(r.tags[POINT_TAG]) for r in runs})


def tail(tmp_path) -> str:
    return (tmp_path / "daemon.log").read_text()[-3000:]
