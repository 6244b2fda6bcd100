"""MLflow on production stores: a real `mlflow server` with PostgreSQL as its backend store and its artifacts on
S3-compatible storage (conftest's `postgres`, `moto_endpoint`, `start_mlflow_server`), and a tracking URI that
names a database or a server that cannot be used, which is one clear error naming the setting and the host, with
no password in it (MLflowTracking.client's check, resources/tracking_store.py)."""

from __future__ import annotations

import time
import traceback

import pytest
from dagster import AssetSelection, DagsterInstance, materialize

from dragon_dagster.assets.factory import build_pipeline_defs
from dragon_dagster.engine.pipeline import load
from dragon_dagster.engine.release.model_registry import RegistryError
from dragon_dagster.engine.text.uris import without_password
from dragon_dagster.resources import ArtifactStore, MLflowTracking, TrainingResource
from dragon_dagster.resources.tracking_store import TrackingStoreError
from tests.support import (
    MLFLOW_WITHOUT_JOBS,
    bucket_keys,
    closed_port,
    new_bucket,
    on_a_command_line,
    s3_env,
    write_pipeline,
)

WRONG = "not-the-Password-7x"  # distinctive, so finding it anywhere is meaningful


def full_text(exc: BaseException) -> str:
    """Everything a traceback of exc shows: its message, its chain and its frames."""
    return "".join(traceback.format_exception(exc))


@pytest.fixture()
def no_tracking_env(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def test_a_store_url_is_shown_without_its_password():
    cases = {
        "postgresql://dragon:s3cr%40t@db.internal:5432/mlflow": "postgresql://dragon:***@db.internal:5432/mlflow",
        "postgresql+psycopg://u:p@ss@h/db?sslmode=require&password=x": (
            "postgresql+psycopg://u:***@h/db?sslmode=require&password=***"
        ),
        "https://user:token@mlflow.example.com/": "https://user:***@mlflow.example.com/",
    }
    for uri, shown in cases.items():
        assert without_password(uri) == shown
    for unchanged in ("sqlite:///x.db", "sqlite:////abs/x.db", "http://127.0.0.1:5000", "postgresql://u@h/db", ""):
        assert without_password(unchanged) == unchanged


def test_a_wrong_database_password_is_one_error_naming_the_setting_without_the_password(
    postgres, tmp_path, monkeypatch, no_tracking_env, caplog
):
    database = postgres.create_database().rsplit("/", 1)[1]
    tracking = MLflowTracking(tracking_uri=postgres.url(database, password=WRONG), runs_dir=str(tmp_path / "runs"))
    start = time.monotonic()
    with pytest.raises(TrackingStoreError) as caught:
        tracking.experiment_id("tiny")
    took = time.monotonic() - start
    message = str(caught.value)
    assert message == (
        f"MLflow's database on 127.0.0.1:{postgres.port} (MLflowTracking.tracking_uri: "
        f"postgresql://dragon:***@127.0.0.1:{postgres.port}/{database}): "
        'password authentication failed for user "dragon". '
        "Fix: correct the user or password in MLflowTracking.tracking_uri (a password percent-encoded in a URL)."
    )
    assert WRONG not in full_text(caught.value) and WRONG not in caplog.text
    assert caught.value.__cause__ is None and caught.value.__context__ is None, "one error, not a chain"
    assert took < 10, f"{took:.1f} s: MLflow's own retries would take about 100 s"
    assert isinstance(caught.value, RegistryError), "handled wherever a registry that does not answer is"

    # the right password: the same database is MLflow's store, runs and step metrics in its tables
    tracking = MLflowTracking(tracking_uri=postgres.url(database), runs_dir=str(tmp_path / "runs"))
    monkeypatch.chdir(tmp_path)  # MLflow's default artifact root for a database store is ./mlruns
    run_id = tracking.start_run("tiny", "direct", {"stage": "direct"}, {"lr": 0.1})
    for step in range(3):
        tracking.log_metrics(run_id, {"loss": 1.0 / (step + 1)}, step=step)
    tracking.end_run(run_id)
    assert postgres.sql(f"SELECT status FROM runs WHERE run_uuid = '{run_id}'", database) == "FINISHED"
    assert postgres.sql(f"SELECT count(*) FROM metrics WHERE run_uuid = '{run_id}'", database) == "3"
    assert postgres.sql(f"SELECT value FROM params WHERE run_uuid = '{run_id}' AND key = 'lr'", database) == "0.1"


def test_a_wrong_database_password_fails_the_asset_with_that_error(postgres, tiny_model, tmp_path, no_tracking_env):
    """What a Dagster user sees: the first step that writes to MLflow (the dataset, which opens the pipeline's run)
    fails with the one message, before anything is trained."""
    database = postgres.create_database().rsplit("/", 1)[1]
    runs = tmp_path / "runs"
    resources = {
        "store": ArtifactStore(runs_dir=str(runs)),
        "tracking": MLflowTracking(tracking_uri=postgres.url(database, password=WRONG), runs_dir=str(runs)),
        "training": TrainingResource(device="cpu"),
    }
    pipeline = load(write_pipeline(tmp_path / "defs", tiny_model))
    (tmp_path / "home").mkdir()
    result = materialize(
        build_pipeline_defs(pipeline)["assets"],
        resources=resources,
        instance=DagsterInstance.local_temp(str(tmp_path / "home")),
        selection=AssetSelection.assets(*[["tiny", n] for n in ("tickets", "sft_dataset", "sft_adapter")]),
        raise_on_error=False,
    )
    assert not result.success
    [failure] = result.get_step_failure_events()
    error = failure.step_failure_data.error  # Dagster's "error while executing op", caused by ours
    assert failure.step_key == "tiny__sft_dataset" and error.cause.cls_name == "TrackingStoreError"
    qualified = "dragon_dagster.resources.tracking_store.TrackingStoreError"
    assert error.cause.message.startswith(f"{qualified}: MLflow's database")
    assert "password authentication failed" in error.cause.message
    assert error.cause.cause is None and error.cause.context is None, "one error, not a chain"
    assert WRONG not in error.to_string()
    assert not list(runs.glob("artifacts/tiny/sft_adapter/*")), "nothing was trained"


def test_an_unreachable_database_host_is_the_same_kind_of_error(tmp_path, no_tracking_env, caplog):
    port = closed_port()
    tracking = MLflowTracking(tracking_uri=f"postgresql://dragon:{WRONG}@127.0.0.1:{port}/mlflow")
    start = time.monotonic()
    with pytest.raises(TrackingStoreError) as caught:
        tracking.client()
    assert str(caught.value) == (
        f"MLflow's database on 127.0.0.1:{port} (MLflowTracking.tracking_uri: postgresql://dragon:***@127.0.0.1:{port}"
        f"/mlflow): Connection refused. Fix: start PostgreSQL on 127.0.0.1:{port}, or correct the host and port in "
        "MLflowTracking.tracking_uri."
    )
    assert WRONG not in full_text(caught.value) and WRONG not in caplog.text
    assert time.monotonic() - start < 10


def test_a_tracking_server_that_is_down_is_the_same_kind_of_error_naming_the_variable(monkeypatch):
    """The URI from $MLFLOW_TRACKING_URI: the message names the variable, and fails in seconds, not after MLflow's
    retries (about four minutes)."""
    port = closed_port()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://mlflow:{WRONG}@127.0.0.1:{port}")
    start = time.monotonic()
    with pytest.raises(TrackingStoreError) as caught:
        MLflowTracking().experiment_id("tiny")
    assert str(caught.value) == (
        f"MLflow's tracking server on 127.0.0.1:{port} ($MLFLOW_TRACKING_URI: http://mlflow:***@127.0.0.1:{port}): "
        f"Connection refused. Fix: start the MLflow tracking server on 127.0.0.1:{port}, or correct the host and port "
        "in $MLFLOW_TRACKING_URI."
    )
    assert WRONG not in full_text(caught.value)
    assert time.monotonic() - start < 10


# ------------------------------------------------------------------------- a real server on PostgreSQL and S3


def stage_runs(client, experiment_id: str) -> dict:
    """The runs of an experiment by their stage tag (the pipeline's run has none: key None)."""
    return {run.data.tags.get("stage"): run for run in client.search_runs([experiment_id])}


@pytest.mark.slow  # a server start on a new PostgreSQL database and a tiny chain: about 90 s on 2 cores
def test_a_pipeline_tracks_and_registers_on_a_server_backed_by_postgres_and_s3(
    postgres, moto_endpoint, start_mlflow_server, tiny_model, tmp_path, monkeypatch
):
    """`MLFLOW_BACKEND_STORE_URI=postgresql://... mlflow server --artifacts-destination s3://...`: the server alone
    holds the database password (in its environment, never on a command line) and the bucket's keys; the pipeline
    (and its training worker) knows only the server's URL, and its artifacts go through the server's proxy into
    the bucket."""
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_S3_ENDPOINT_URL", "AWS_PROFILE", "AWS_SESSION_TOKEN", *s3_env("")):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    store = postgres.create_database()
    database = store.rsplit("/", 1)[1]
    bucket = new_bucket(moto_endpoint)
    url = start_mlflow_server(
        store,
        f"s3://{bucket}/mlflow",
        env={**s3_env(moto_endpoint), "MLFLOW_S3_ENDPOINT_URL": moto_endpoint, **MLFLOW_WITHOUT_JOBS},
    )

    assert not on_a_command_line(postgres.password)

    runs = tmp_path / "runs"
    tracking = MLflowTracking(tracking_uri=url, ui_url=url, runs_dir=str(runs))
    resources = {
        "store": ArtifactStore(runs_dir=str(runs)),
        "tracking": tracking,
        "training": TrainingResource(device="cpu"),
    }
    pipeline = load(write_pipeline(tmp_path / "defs", tiny_model))
    (tmp_path / "home").mkdir()
    result = materialize(
        build_pipeline_defs(pipeline)["assets"],
        resources=resources,
        instance=DagsterInstance.local_temp(str(tmp_path / "home")),
        selection=AssetSelection.assets(
            *[["tiny", n] for n in ("tickets", "sft_dataset", "sft_adapter", "merged_model")]
        ),
    )
    assert result.success
    assert not (runs / "mlflow.db").exists() and not (tmp_path / "mlruns").exists(), "nothing tracked locally"

    from mlflow import MlflowClient

    client = MlflowClient(url)  # what anyone with the server's URL sees
    experiment = client.get_experiment_by_name("tiny")
    assert experiment.artifact_location.startswith("mlflow-artifacts:"), "artifacts go through the server"
    by_stage = stage_runs(client, experiment.experiment_id)
    sft, merge = by_stage["sft_adapter"], by_stage["merged_model"]
    assert sft.info.status == "FINISHED" and sft.data.params["method"] == "sft"
    assert sft.data.params["model"] == str(tiny_model) and sft.data.params["args.max_steps"] == "8"
    assert sft.data.tags["dagster_run_id"] == result.run_id and sft.data.tags["asset_key"] == "tiny/sft_adapter"
    loss = client.get_metric_history(sft.info.run_id, "train/loss")
    assert sorted(m.step for m in loss) == [1, 2, 4, 6, 8], loss  # the first step, then every logging_steps
    version = client.get_model_version_by_alias("tiny", "challenger")
    assert version.run_id == merge.info.run_id and version.tags["asset_key"] == "tiny/merged_model"

    # the artifacts are objects in the bucket, under the destination's prefix
    keys = bucket_keys(bucket, "mlflow/", endpoint=moto_endpoint)
    prefix = f"mlflow/{experiment.experiment_id}/{sft.info.run_id}/artifacts/"
    assert {f"{prefix}job.json", f"{prefix}metrics.json", f"{prefix}loss.png"} <= set(keys), keys
    assert [k for k in keys if k.endswith("/model.safetensors")], "the registered model's weights are in S3"

    # and the records are rows in PostgreSQL's MLflow tables
    def count(query: str) -> int:
        return int(postgres.sql(query, database))

    assert count(f"SELECT count(*) FROM runs WHERE experiment_id = {experiment.experiment_id}") == len(by_stage)
    assert count(f"SELECT count(*) FROM metrics WHERE run_uuid = '{sft.info.run_id}' AND key = 'train/loss'") == 5
    assert count(f"SELECT count(*) FROM tags WHERE run_uuid = '{sft.info.run_id}' AND key = 'dagster_run_id'") == 1
    assert count("SELECT count(*) FROM model_versions WHERE name = 'tiny'") == int(version.version) == 1
