"""A runs directory moved or copied takes its MLflow experiments along (tracking_store.keep_relocatable), through
MLflow's own store and read back through its client API; an artifact location that is not ours is refused. A real
MLflow sqlite store throughout."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from mlflow import MlflowClient

from dragon_dagster.resources import MLflowTracking
from dragon_dagster.resources.tracking_store import RelocatedStoreError, check_relocated, relocate_experiment


def log_one(tracking: MLflowTracking, name: str, source: Path) -> str:
    run_id = tracking.start_run("tiny", name, {"stage": name}, {"x": 1})
    tracking.log_artifacts(run_id, [source])
    tracking.end_run(run_id)
    return run_id


def artifact_files(runs: Path) -> list[Path]:
    return sorted(p for p in (runs / "mlartifacts").rglob("*") if p.is_file())


def test_a_copied_or_moved_runs_dir_logs_into_itself(tmp_path):
    note = tmp_path / "note.txt"
    note.write_text("hello")
    old = tmp_path / "a" / "runs"
    first = log_one(MLflowTracking(runs_dir=str(old)), "first", note)
    assert len(artifact_files(old)) == 1
    original = MLflowTracking(runs_dir=str(old))
    model = original.client().create_logged_model(original.experiment_id("tiny"), source_run_id=first)
    assert model.artifact_location.startswith((old / "mlartifacts").as_uri() + "/")

    copy = tmp_path / "b" / "runs"
    shutil.copytree(old, copy)
    tracking = MLflowTracking(runs_dir=str(copy))
    second = log_one(tracking, "second", note)
    assert len(artifact_files(old)) == 1  # nothing written into the original
    assert len(artifact_files(copy)) == 2 and all(second in str(p) or first in str(p) for p in artifact_files(copy))
    client = tracking.client()
    assert client.get_experiment_by_name("tiny").artifact_location == (copy / "mlartifacts" / "tiny").as_uri()
    for run_id in (first, second):  # the copied run moved along, and its artifact reads from the copy
        assert client.get_run(run_id).info.artifact_uri.startswith((copy / "mlartifacts").as_uri() + "/")
        assert client.get_run(run_id).data.params == {"x": "1"}  # and keeps what it logged
    assert Path(client.download_artifacts(first, "note.txt", str(tmp_path / "dl"))).read_text() == "hello"
    assert client.get_logged_model(model.model_id).artifact_location.startswith((copy / "mlartifacts").as_uri() + "/")

    third = log_one(MLflowTracking(runs_dir=str(old)), "third", note)  # the original keeps working on its own
    assert len(artifact_files(old)) == 2 and any(third in str(p) for p in artifact_files(old))
    assert len(artifact_files(copy)) == 2

    moved = tmp_path / "c" / "runs"
    moved.parent.mkdir()
    copy.rename(moved)
    fourth = log_one(MLflowTracking(runs_dir=str(moved)), "fourth", note)
    assert len(artifact_files(moved)) == 3 and any(fourth in str(p) for p in artifact_files(moved))
    assert not copy.exists() and len(artifact_files(old)) == 2
    runs = MlflowClient(f"sqlite:///{moved / 'mlflow.db'}").search_runs(
        [MLflowTracking(runs_dir=str(moved)).experiment_id("tiny")]
    )
    assert {r.info.run_name for r in runs} == {"first", "second", "fourth"}


def test_an_artifact_location_that_is_not_ours_is_refused_by_name(tmp_path):
    runs = tmp_path / "runs"
    tracking = MLflowTracking(runs_dir=str(runs))
    foreign = (tmp_path / "somewhere-else" / "artifacts").as_uri()
    MlflowClient(tracking.uri).create_experiment("tiny", artifact_location=foreign)
    with pytest.raises(RelocatedStoreError) as info:
        tracking.start_run("tiny", "sft_adapter", {}, {})
    message = str(info.value)
    assert foreign in message and str(runs) in message and "Fix:" in message
    assert not (tmp_path / "somewhere-else").exists()


def test_what_a_move_left_at_the_old_place_is_named_and_a_second_move_finds_nothing(tmp_path):
    """check_relocated turns a MLflow release that keeps a location where relocate_experiment does not reach into
    an error: here nothing was moved yet, so the experiment and its run are named; after the move it passes, and
    moving again (a concurrent caller) moves nothing."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    old, new = (tmp_path / "a" / "tiny").as_uri(), (tmp_path / "b" / "tiny").as_uri()
    client = MlflowClient(uri)
    experiment = client.create_experiment("tiny", artifact_location=old)
    run = client.create_run(experiment).info.run_id
    with pytest.raises(RelocatedStoreError) as info:
        check_relocated(client, experiment, old)
    assert "the experiment" in str(info.value) and f"run {run}" in str(info.value) and old in str(info.value)

    assert relocate_experiment(uri, experiment, old, new) == 1
    check_relocated(client, experiment, old)
    assert client.get_run(run).info.artifact_uri == f"{new}/{run}/artifacts"
    assert relocate_experiment(uri, experiment, old, new) == 0
