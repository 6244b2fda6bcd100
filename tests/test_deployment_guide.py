"""What `make ui` and `dragon mlflow-ui` serve for each kind of tracking URI (issue 59): the configured store,
never a local sqlite file behind a production port."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from dragon_dagster.cli.deploy import mlflow_ui_plan
from dragon_dagster.resources.tracking import MLflowTracking

ROOT = Path(__file__).resolve().parents[1]


def test_mlflow_s_ui_is_the_configured_tracking_store(tmp_path, monkeypatch):
    """An http(s) tracking URI is a server, and the server is the UI: nothing local is served, and the address has
    no credentials. A database URI is served as is; only with none set is it the runs directory's sqlite file."""
    monkeypatch.setenv("DRAGON_RUNS_DIR", str(tmp_path / "runs"))
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_UI_URL"):
        monkeypatch.delenv(name, raising=False)
    local = mlflow_ui_plan("127.0.0.1", 5077)
    assert local.store == f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}" and local.address == "http://127.0.0.1:5077"
    assert local.store == MLflowTracking().uri, "the store the resource logs to"

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "https://ops:t0ken@mlflow.internal:5443/mlflow/")
    remote = mlflow_ui_plan("127.0.0.1", 5077)
    assert remote.store is None and remote.address == "https://mlflow.internal:5443/mlflow"
    assert remote.setting == "$MLFLOW_TRACKING_URI" == MLflowTracking().setting
    assert MLflowTracking().ui == remote.address, "the links point at the server too"
    monkeypatch.setenv("MLFLOW_UI_URL", "https://mlflow.example")
    assert MLflowTracking().ui == "https://mlflow.example", "unless the UI's address is set"

    database = "postgresql://mlflow:pw@db.internal:5432/mlflow"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", database)
    assert mlflow_ui_plan("127.0.0.1", 5077).store == database == MLflowTracking().uri
    assert mlflow_ui_plan("127.0.0.1", 5077, tracking_uri="http://h:5000").store is None, "the resource's wins"
    assert MLflowTracking(tracking_uri="http://h:5000").setting == "MLflowTracking.tracking_uri"


def make_ui(env: dict[str, str]) -> list[str]:
    """The commands `make ui` would run with env, without running them (install taken as done)."""
    done = subprocess.run(
        ["make", "-s", "-n", "-o", "install", "ui", "MLFLOW_PORT=5077", "DAGSTER_PORT=3077"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.splitlines()


def test_make_ui_serves_the_configured_stores(tmp_path):
    """With a deployment's env loaded, `make ui` keeps its runs directory, serves Dagster from DAGSTER_POSTGRES_URL
    and leaves MLflow to `dragon mlflow-ui` (above), never `mlflow ui` on the checkout's runs/mlflow.db."""
    deployed = {
        **os.environ,
        "DRAGON_RUNS_DIR": str(tmp_path / "runs"),
        "MLFLOW_TRACKING_URI": "http://mlflow.internal:5000",
        "DAGSTER_POSTGRES_URL": "postgresql+psycopg2://dagster:pw@db.internal:5432/dagster",
    }
    commands = make_ui(deployed)
    assert not any("mlflow.db" in line or "mlflow ui" in line for line in commands), commands
    assert any("dragon mlflow-ui --host 127.0.0.1 --port 5077" in line for line in commands), commands
    [banner] = [line for line in commands if line.startswith("echo ")]
    shown = subprocess.run(["bash", "-c", banner], capture_output=True, text=True, check=True).stdout
    assert shown.startswith("Dagster UI: http://127.0.0.1:3077 ") and "instance: postgres" in shown
    # what make passes on: the deployment's runs directory, not the checkout's
    printed = subprocess.run(
        ["make", "-s", "--eval", "print-runs:\n\t@echo $$DRAGON_RUNS_DIR", "print-runs"],
        cwd=ROOT,
        env=deployed,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.strip()
    assert printed == str(tmp_path / "runs")

    alone = {k: v for k, v in os.environ.items() if k not in ("DAGSTER_POSTGRES_URL", "DAGSTER_INSTANCE")}
    assert (
        "instance: sqlite"
        in subprocess.run(
            ["bash", "-c", next(line for line in make_ui(alone) if line.startswith("echo "))],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
