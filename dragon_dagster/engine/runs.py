"""Reading the runs directory and the MLflow store back: artifact listings and run comparisons."""

from __future__ import annotations

import time
from pathlib import Path

from . import catalog
from .artifacts.manifest import Manifest, ManifestError, read_manifest
from .config.results import ROW_METRICS, StageResult


def list_artifacts(runs_dir: Path, pipeline: str | None = None, folder: str = "artifacts") -> list[dict]:
    """The artifact directories under runs_dir/<folder> (archived ones are under archived/), newest first."""
    root = Path(runs_dir) / folder
    rows = []
    for directory in root.glob(f"{pipeline or '*'}/*/*"):
        if directory.name.startswith(".tmp-") or not directory.is_dir():
            continue
        try:
            manifest = read_manifest(directory)
        except ManifestError:  # not an artifact of ours (a folder someone put there): listed, marked unknown
            manifest = Manifest(kind="?")
        rows.append(
            {
                "asset": f"{directory.parent.parent.name}/{directory.parent.name}",
                "kind": manifest.kind,
                "created": manifest.created,
                "mlflow_run_id": manifest.mlflow_run_id,
                "dir": str(directory),
            }
        )
    return sorted(rows, key=lambda r: (r["created"], r["dir"]), reverse=True)


def latest_artifact(runs_dir: Path, asset: str) -> Path | None:
    pipeline, _, stage = asset.partition("/")
    matches = [r for r in list_artifacts(runs_dir, pipeline) if r["asset"] == f"{pipeline}/{stage}"]
    return Path(matches[0]["dir"]) if matches else None


def artifact_dir_of(path: str | Path, runs_dir: Path) -> Path | None:
    """The artifact directory (artifacts/<pipeline>/<stage>/<id>) a path is in, None outside them."""
    root = (Path(runs_dir) / "artifacts").resolve()
    try:
        parts = Path(path).resolve().relative_to(root).parts
    except (ValueError, OSError):
        return None
    return root.joinpath(*parts[:3]) if len(parts) >= 3 else None


def paths_in(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from paths_in(item)
    elif isinstance(value, list):
        for item in value:
            yield from paths_in(item)


def prunable(runs_dir: Path, keep: set[Path]) -> tuple[list[Path], set[Path]]:
    """(artifact directories nothing refers to, the ones kept). Kept: the roots in keep, the newest artifact
    of each asset (what chat falls back to), and whatever a kept manifest names (its adapters, datasets,
    merged model...), followed to the end of the chain."""
    everything = {Path(r["dir"]).resolve() for r in list_artifacts(runs_dir)}
    newest = {}
    for row in list_artifacts(runs_dir):  # newest first
        newest.setdefault(row["asset"], Path(row["dir"]).resolve())
    pending = [d for d in ({artifact_dir_of(k, runs_dir) for k in keep} | set(newest.values())) if d is not None]
    kept: set[Path] = set()
    while pending:
        directory = pending.pop()
        if directory in kept:
            continue
        kept.add(directory)
        try:
            fields = read_manifest(directory).model_dump()
        except ManifestError:
            fields = {}
        for value in paths_in(fields):
            found = artifact_dir_of(value, runs_dir) if "/" in value else None
            if found is not None and found not in kept:
                pending.append(found)
    return sorted(everything - kept), kept


LAST_STEP = ("train/loss", "train/reward", "train/kl")  # the last training step's figures, beside the held-out


def comparison(tracking_uri: str, experiment: str | None = None) -> list[dict]:
    """One row per MLflow run, newest first: stage, method, status, lineage, every eval/* and judge/* metric,
    the last train/loss, train/reward and train/kl, and `headline`: the stage's own figures in one line, as its
    kind's result model words them (a reward before and after, a preference accuracy, a perplexity), so that no
    run shows empty when MLflow holds its metrics."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)
    experiments = [client.get_experiment_by_name(experiment)] if experiment else client.search_experiments()
    ids = [e.experiment_id for e in experiments if e is not None]
    if not ids:
        return []
    names = {e.experiment_id: e.name for e in experiments if e is not None}
    rows = []
    for run in client.search_runs(ids, order_by=["attributes.start_time DESC"], max_results=1000):
        tags, metrics = run.data.tags, run.data.metrics
        row = {
            "experiment": names.get(run.info.experiment_id),
            "run": run.info.run_name,
            "run_id": run.info.run_id,
            "stage": tags.get("stage"),
            "method": tags.get("method"),
            "status": run.info.status,
            "headline": headline(metrics, tags.get("kind") or tags.get("method")),
            "upstream": (tags.get("upstream_mlflow_run_id") or "")[:8],
            "started": time.strftime("%Y-%m-%d %H:%M", time.localtime((run.info.start_time or 0) / 1000)),
        }
        row.update({k: v for k, v in metrics.items() if k.startswith(ROW_METRICS) or k in LAST_STEP})
        rows.append(row)
    return rows


def headline(metrics: dict[str, float], kind: str | None = None) -> str:
    """A run's own figures in one line: its kind's result model words them; a run of no kind (the base model,
    the report) shows its held-out figures."""
    result = catalog.KINDS[kind].result if kind in catalog.KINDS else None
    return (result or StageResult).headline(metrics)


def stage_run_metrics(tracking_uri: str, experiment: str, dagster_run_id: str, stage: str) -> dict | None:
    """The MLflow run of `stage` that Dagster run dagster_run_id made, in the pipeline's experiment: {run_id,
    status, metrics}; None when it made none (not run yet, failed before it, or another store). The one place
    that finds a Dagster run's MLflow runs, for `dragon compare --sweep`: each stage's run is tagged
    `dagster_run_id` and `stage` (assets/training.py, assets/report.py)."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return None
    runs = client.search_runs(
        [found.experiment_id],
        f"tags.dagster_run_id = '{dagster_run_id}' and tags.stage = '{stage}'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    if not runs:
        return None
    return {"run_id": runs[0].info.run_id, "status": runs[0].info.status, "metrics": dict(runs[0].data.metrics)}
