"""MLflow tracking: one experiment per pipeline, one run per training materialization."""

from __future__ import annotations

import math
import os
from pathlib import Path

from dagster import ConfigurableResource
from pydantic import Field

from .storage import default_runs_dir


def flatten(prefix: str, values: dict) -> dict[str, str]:
    out = {}
    for key, value in values.items():
        name = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict):
            out.update(flatten(name, value))
        else:
            out[name] = str(value)[:500]
    return out


class MLflowTracking(ConfigurableResource):
    """Logs params, step metrics, eval metrics, lineage tags and artifacts to an MLflow tracking server."""

    tracking_uri: str = Field(default="", description="MLflow tracking URI. Empty: a sqlite store in the runs dir.")
    ui_url: str = Field(default="http://127.0.0.1:5000", description="Where `make ui` serves MLflow, for links.")
    runs_dir: str = Field(default="", description="Runs directory for the default sqlite store and artifacts.")

    @property
    def root(self) -> Path:
        return Path(self.runs_dir).resolve() if self.runs_dir else default_runs_dir()

    @property
    def uri(self) -> str:
        if self.tracking_uri:
            return self.tracking_uri
        self.root.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{self.root / 'mlflow.db'}"

    def client(self):
        from mlflow import MlflowClient

        return MlflowClient(self.uri)

    def experiment_id(self, pipeline: str) -> str:
        client = self.client()
        experiment = client.get_experiment_by_name(pipeline)
        if experiment is not None:
            return experiment.experiment_id
        location = None
        if self.uri.startswith("sqlite:"):  # keep artifacts beside the store, not in the current directory
            location = (self.root / "mlartifacts" / pipeline).as_uri()
        try:
            return client.create_experiment(pipeline, artifact_location=location)
        except Exception:  # created by a concurrent run in the meantime
            return client.get_experiment_by_name(pipeline).experiment_id

    def start_run(self, pipeline: str, run_name: str, tags: dict[str, str], params: dict) -> str:
        client = self.client()
        run = client.create_run(self.experiment_id(pipeline), run_name=run_name,
                                tags={k: str(v) for k, v in tags.items() if v is not None})
        from mlflow.entities import Param

        flat = flatten("", params)
        items = [Param(k, v) for k, v in flat.items()]
        for start in range(0, len(items), 90):
            client.log_batch(run.info.run_id, params=items[start:start + 90])
        return run.info.run_id

    def log_metrics(self, run_id: str, values: dict, step: int = 0, finite_only: bool = True) -> None:
        """finite_only=False keeps NaN and inf: a training step's NaN loss is worth seeing on the chart."""
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, float(v), now, step) for k, v in values.items()
                   if isinstance(v, (int, float)) and (math.isfinite(v) or not finite_only)]
        if metrics:
            self.client().log_batch(run_id, metrics=metrics)

    def log_artifacts(self, run_id: str, paths: list[Path], artifact_path: str | None = None) -> None:
        client = self.client()
        for path in paths:
            path = Path(path)
            if path.is_dir():
                client.log_artifacts(run_id, str(path), artifact_path=artifact_path or path.name)
            elif path.exists():
                client.log_artifact(run_id, str(path), artifact_path=artifact_path)

    def end_run(self, run_id: str, status: str = "FINISHED") -> None:
        self.client().set_terminated(run_id, status=status)

    def run_url(self, pipeline: str, run_id: str) -> str:
        return f"{self.ui_url.rstrip('/')}/#/experiments/{self.experiment_id(pipeline)}/runs/{run_id}"

    def env(self) -> dict[str, str]:
        return {"MLFLOW_TRACKING_URI": self.uri, **({"MLFLOW_ALLOW_FILE_STORE": "true"}
                                                     if os.environ.get("MLFLOW_ALLOW_FILE_STORE") else {})}
