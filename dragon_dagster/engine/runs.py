"""Reading the runs directory and the MLflow store back: artifact listings and run comparisons."""

from __future__ import annotations

import time

from pathlib import Path

from .artifacts import read_manifest


def list_artifacts(runs_dir: Path, pipeline: str | None = None) -> list[dict]:
    root = Path(runs_dir) / "artifacts"
    rows = []
    for directory in root.glob(f"{pipeline or '*'}/*/*"):
        if directory.name.startswith(".tmp-") or not directory.is_dir():
            continue
        manifest = read_manifest(directory)
        rows.append({"asset": f"{directory.parent.parent.name}/{directory.parent.name}",
                     "kind": manifest.get("kind", "?"), "created": manifest.get("created", ""),
                     "mlflow_run_id": manifest.get("mlflow_run_id"), "dir": str(directory)})
    return sorted(rows, key=lambda r: (r["created"], r["dir"]), reverse=True)


def latest_artifact(runs_dir: Path, asset: str) -> Path | None:
    pipeline, _, stage = asset.partition("/")
    matches = [r for r in list_artifacts(runs_dir, pipeline) if r["asset"] == f"{pipeline}/{stage}"]
    return Path(matches[0]["dir"]) if matches else None


def comparison(tracking_uri: str, experiment: str | None = None) -> list[dict]:
    """One row per MLflow run: stage, status, lineage and every eval/* metric, newest first."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)
    experiments = [client.get_experiment_by_name(experiment)] if experiment else client.search_experiments()
    ids = [e.experiment_id for e in experiments if e is not None]
    if not ids:
        return []
    names = {e.experiment_id: e.name for e in experiments if e is not None}
    rows = []
    for run in client.search_runs(ids, order_by=["attributes.start_time DESC"], max_results=1000):
        tags = run.data.tags
        row = {"experiment": names.get(run.info.experiment_id), "run": run.info.run_name,
               "run_id": run.info.run_id, "stage": tags.get("stage"), "status": run.info.status,
               "upstream": tags.get("upstream_mlflow_run_id", "")[:8],
               "started": time.strftime("%Y-%m-%d %H:%M", time.localtime((run.info.start_time or 0) / 1000))}
        row.update({k: v for k, v in run.data.metrics.items() if k.startswith("eval/")})
        rows.append(row)
    return rows
