"""The links `make ui` prints open what they name."""

import os
import subprocess
import sys
from pathlib import Path

from dragon_dagster.resources.tracking import TRAINING_VIEW

ROOT = Path(__file__).resolve().parents[1]


def test_make_ui_prints_mlflow_s_model_training_view_on_its_port(tmp_path):
    """MLflow's bare address opens its GenAI overview, which shows nothing of a training pipeline: the printed
    link names the model-training view (as every link the project prints does) on the port `make ui` serves.
    `make ui` prints Dagster's; MLflow's is `dragon mlflow-ui`'s, which it runs with the port."""
    printed = subprocess.run(
        ["make", "-s", "-n", "-o", "install", "ui", "MLFLOW_PORT=5077", "DAGSTER_PORT=3077"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    [banner] = [line for line in printed.splitlines() if line.startswith("echo ")]
    shown = subprocess.run(["bash", "-c", banner], capture_output=True, text=True, check=True).stdout
    assert shown.startswith("Dagster UI: http://127.0.0.1:3077 ")
    assert "dragon mlflow-ui --host 127.0.0.1 --port 5077 &" in printed
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "MLFLOW_UI_URL")}
    mlflow = subprocess.run(
        [str(Path(sys.executable).with_name("dragon")), "mlflow-ui", "--port", "5077", "--dry-run"],
        env={**env, "DRAGON_RUNS_DIR": str(tmp_path / "runs")},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert mlflow.startswith(f"MLflow UI: http://127.0.0.1:5077/#/experiments?{TRAINING_VIEW} ")
