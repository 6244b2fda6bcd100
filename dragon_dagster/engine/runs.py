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
        rows.append(
            {
                "asset": f"{directory.parent.parent.name}/{directory.parent.name}",
                "kind": manifest.get("kind", "?"),
                "created": manifest.get("created", ""),
                "mlflow_run_id": manifest.get("mlflow_run_id"),
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


def _paths_in(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _paths_in(item)
    elif isinstance(value, list):
        for item in value:
            yield from _paths_in(item)


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
        for value in _paths_in(read_manifest(directory)):
            found = artifact_dir_of(value, runs_dir) if "/" in value else None
            if found is not None and found not in kept:
                pending.append(found)
    return sorted(everything - kept), kept


# What each run's row carries besides the headline: every held-out figure, the judge's, and the last training step's.
ROW_METRICS = ("eval/", "judge/")
LAST_STEP = ("train/loss", "train/reward", "train/kl")


def comparison(tracking_uri: str, experiment: str | None = None) -> list[dict]:
    """One row per MLflow run, newest first: stage, method, status, lineage, every eval/* and judge/* metric,
    the last train/loss, train/reward and train/kl, and `headline`: the stage's own figures in one line (a
    GRPO run's reward before and after, a DPO run's preference accuracy and margin, an SFT run's or the
    report's perplexity and task metrics), so that no run shows empty when MLflow holds its metrics."""
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
            "headline": headline(metrics),
            "upstream": (tags.get("upstream_mlflow_run_id") or "")[:8],
            "started": time.strftime("%Y-%m-%d %H:%M", time.localtime((run.info.start_time or 0) / 1000)),
        }
        row.update({k: v for k, v in metrics.items() if k.startswith(ROW_METRICS) or k in LAST_STEP})
        rows.append(row)
    return rows


def headline(metrics: dict[str, float]) -> str:
    """A run's own figures in one line, chosen by what it logged (the loss is a column of its own)."""

    def fig(value) -> str:
        return f"{value:.4g}" if isinstance(value, (int, float)) else "?"

    parts = []
    if any(k in metrics for k in ("eval/reward", "eval/reward_before", "train/reward")):  # GRPO
        if "eval/reward" in metrics or "eval/reward_before" in metrics:
            parts.append(f"reward {fig(metrics.get('eval/reward_before'))} -> {fig(metrics.get('eval/reward'))}")
        per_reward = {
            k[len("eval/reward_") :]: v
            for k, v in sorted(metrics.items())
            if k.startswith("eval/reward_") and k not in ("eval/reward_before", "eval/reward_margin")
        }
        if per_reward:
            each = "(" + ", ".join(f"{name} {fig(v)}" for name, v in per_reward.items()) + ")"
            parts[-1:] = [f"{parts[-1]} {each}"] if parts else [each]
        if "train/reward" in metrics:
            parts.append(f"train reward {fig(metrics['train/reward'])}")
        if "train/kl" in metrics:
            parts.append(f"kl {fig(metrics['train/kl'])}")
    elif "eval/pref_accuracy" in metrics or "eval/reward_margin" in metrics:  # DPO, ORPO
        parts += [
            f"{name} {fig(metrics[f'eval/{name}'])}"
            for name in ("pref_accuracy", "reward_margin", "dpo_loss", "orpo_loss")
            if f"eval/{name}" in metrics
        ]  # a preference objective: its own figures, never eval/loss
    else:  # SFT, the base model, the report
        shown = {k: v for k, v in metrics.items() if k.startswith(ROW_METRICS) and k != "eval/loss"}
        first = [k for k in ("eval/perplexity",) if k in shown]
        for key in first + sorted(k for k in shown if k not in first):
            parts.append(f"{key.removeprefix('eval/')} {fig(shown[key])}")
    if not parts and "train/loss" in metrics:  # a run stopped before its held-out figures
        parts.append(f"train loss {fig(metrics['train/loss'])}")
    return ", ".join(parts)
