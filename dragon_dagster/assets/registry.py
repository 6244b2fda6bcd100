"""The Dagster side of the model registry: register each merged model, promote one to champion.

A merged model becomes a new version of the registered model named after the pipeline (alias `challenger`) on
the MLflow run that trained its last adapter, tagged with the Dagster run, the asset and the upstream runs. A
version becomes `champion` when a gate passes: the pipeline's `merged_not_worse_than_base` check, or a
retraining's `promotion_gate`. Chat, serving and retraining use the champion (engine/model_registry.py).
"""

from __future__ import annotations

import json
from pathlib import Path

from dagster import Failure

from ..engine.artifacts import read_manifest
from ..engine.model_registry import RegistryError
from ..engine.runs import latest_artifact
from ..engine.spec.pipeline import Pipeline


def register_merged_model(context, pipeline: Pipeline, tracking, model_dir: Path, final: Path,
                          adapter_manifest: dict) -> str:
    """Register the model being written at model_dir (to be published at final/model); returns its version."""
    chain_runs = [read_manifest(Path(a).parent).get("mlflow_run_id") for a in adapter_manifest.get("chain", [])
                  if (Path(a).parent / "manifest.json").exists()]
    tags = {"pipeline": pipeline.name, "dagster_run_id": context.run_id,
            "asset_key": context.asset_key.to_user_string(), "artifact_dir": str(final),
            "model_dir": str(final / "model"), "base_model": adapter_manifest.get("base_model"),
            "started_from": adapter_manifest.get("resolved_model"),
            "upstream_mlflow_run_ids": ",".join(r for r in chain_runs if r),
            "stages": ",".join(Path(a).parent.parent.name for a in adapter_manifest.get("chain", []))}
    version = tracking.register_model(pipeline.name, model_dir, adapter_manifest.get("mlflow_run_id"), tags,
                                      description=pipeline.description or "")
    context.log.info(f"registered models:/{pipeline.name}/{version} (alias challenger)")
    return version


def merged_version(merged_dir: str | Path) -> str | None:
    """The registered version a merged-model artifact recorded in its manifest."""
    return (read_manifest(merged_dir).get("registered_model") or {}).get("version")


def promote_merged(context, pipeline: str, tracking, merged_dir: str | Path, reason: str) -> dict:
    """Make the merged model at merged_dir the champion; metadata for the check that decided it."""
    version = merged_version(merged_dir)
    if version is None:  # merged before models were registered
        context.log.warning(f"{merged_dir} has no registered model version: nothing promoted")
        return {"promoted": "none: the merged model was not registered"}
    replaced = tracking.promote(pipeline, version, reason)
    context.log.info(f"models:/{pipeline}/{version} is now the champion (was {replaced or 'none'})")
    return {"champion": f"models:/{pipeline}/{version}", "previous_champion": str(replaced or "none")}


def deployed_model(tracking, store, pipeline: Pipeline) -> Path:
    """The model people chat with and retraining starts from: the registry's champion, else (no gate has
    passed yet) the latest merged model."""
    try:
        champion = tracking.champion_dir(pipeline.name)
    except RegistryError as exc:
        raise Failure(description=str(exc)) from exc
    if champion is not None:
        return champion
    merge = pipeline.first("merge")
    found = latest_artifact(store.root, f"{pipeline.name}/{merge.name}") if merge else None
    if found is None:
        raise Failure(description=f"no deployed model yet: materialize {pipeline.name}/"
                                  f"{merge.name if merge else 'merged_model'} first")
    return found / "model"


def report_merged_dir(report_dir: Path) -> str:
    return json.loads((report_dir / "manifest.json").read_text())["merged"]
