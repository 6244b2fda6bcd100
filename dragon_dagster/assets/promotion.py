"""The Dagster side of the model registry: register each merged model, promote one to champion.

A merged model becomes a new version of the registered model named after the pipeline (alias `challenger`) on
the merge's own MLflow run (which logs the model; the report later attaches its held-out figures), tagged with
the Dagster run, the asset and the upstream runs. A
version becomes `champion` when a gate passes: the pipeline's `merged_not_worse_than_base` check, or a
retraining's `promotion_gate`. Chat, serving and retraining use the champion (engine/release/model_registry.py).
"""

from __future__ import annotations

from pathlib import Path

from dagster import Failure

from ..engine.artifacts.manifest import AdapterManifest, MergedManifest, ReportManifest, read_manifest
from ..engine.pipeline import Pipeline
from ..engine.release.model_registry import CHAMPION, RegistryError, alias_version, version_for


def register_merged_model(context, pipeline: Pipeline, tracking, final: Path) -> str:
    """Register the published merged model at final (its model/ directory); returns its version. Registered
    after publishing, so the version is found by its artifact_dir tag, not written into the manifest."""
    manifest = read_manifest(final, MergedManifest)
    chain = manifest.adapters
    chain_runs = [read_manifest(Path(a).parent, AdapterManifest).mlflow_run_id for a in chain]
    tags = {
        "pipeline": pipeline.name,
        "dagster_run_id": context.op_execution_context.run_id,
        "asset_key": context.asset_key.to_user_string(),
        "artifact_dir": str(final),
        "model_dir": str(final / "model"),
        "base_model": manifest.base_model,
        "started_from": manifest.resolved_model,
        "upstream_mlflow_run_ids": ",".join(r for r in chain_runs if r),
        "stages": ",".join(Path(a).parent.parent.name for a in chain),
    }
    try:
        version = tracking.register_model(
            pipeline.name,
            final / "model",
            manifest.mlflow_run_id or manifest.upstream_mlflow_run_id,  # older merges had no run: the last stage's
            tags,
            description=pipeline.description or "",
        )
    except Exception as exc:
        raise Failure(
            description=f"the merged model is saved at {final}, but registering it in the MLflow "
            f"registry at {tracking.shown_uri} failed: {exc}. Materialize the merge again once "
            "MLflow is reachable."
        ) from exc
    context.log.info(f"registered models:/{pipeline.name}/{version} (alias challenger)")
    return version


def promote_merged(
    context, pipeline: str, tracking, merged_dir: str | Path, reason: str, only_over: tuple[str, ...] | None = None
) -> dict:
    """Make the merged model at merged_dir the champion; metadata for the check that decided it.

    The version is looked up by its artifact directory in this registry, never taken on trust. only_over:
    asset keys whose versions this promotion may replace; a champion from elsewhere (a retrained model when the
    pipeline's own report passes) stays, and the metadata says so."""
    client = tracking.client()
    version = version_for(client, pipeline, merged_dir)
    if version is None:
        context.log.warning(
            f"{merged_dir} is not a registered version of {pipeline!r} in {tracking.shown_uri}: nothing promoted"
        )
        return {"promoted": f"none: {merged_dir} is not registered in {tracking.shown_uri}"}
    current = alias_version(client, pipeline, CHAMPION)
    if only_over is not None and current is not None and current != version:
        owner = client.get_model_version(pipeline, current).tags.get("asset_key", "")
        if owner not in only_over:
            context.log.info(
                f"champion stays models:/{pipeline}/{current} ({owner}); this model is the "
                f"challenger, models:/{pipeline}/{version}"
            )
            return {
                "champion": f"models:/{pipeline}/{current} (kept: {owner or 'set by hand'})",
                "challenger": f"models:/{pipeline}/{version}",
                "to_promote": f"dragon models {pipeline} --promote {version}",
            }
    if current == version:  # a reused report checked again: nothing moves, and the registry keeps its history
        context.log.info(f"models:/{pipeline}/{version} is the champion already")
        return {"champion": f"models:/{pipeline}/{version} (already)"}
    replaced = tracking.promote(pipeline, version, reason)
    context.log.info(f"models:/{pipeline}/{version} is now the champion (was {replaced or 'none'})")
    return {"champion": f"models:/{pipeline}/{version}", "previous_champion": str(replaced or "none")}


def deployed_model(tracking, store, pipeline: Pipeline) -> Path:
    """The model people chat with and retraining starts from: the registry's champion, else (no gate has
    passed yet) the latest merged model."""
    merge = pipeline.first_of_role("merge")
    merge_stage = merge.name if merge else "merged_model"
    try:
        live = tracking.live_model(pipeline.name, store.root, merge_stage)
    except RegistryError as exc:
        raise Failure(description=str(exc)) from exc
    if live is None:
        raise Failure(description=f"no deployed model yet: materialize {pipeline.name}/{merge_stage} first")
    return live


def report_merged_dir(report_dir: Path) -> str:
    return read_manifest(report_dir, ReportManifest).merged
