"""A merge_adapters asset's work: its input adapters checked as combinable before anything loads, the worker's
job run, and the combined adapter recorded with an adapter manifest like a trainer's, so the merge, evaluation,
export, chat and the registry take it as any adapter."""

from __future__ import annotations

from pathlib import Path

from dagster import Failure, MetadataValue, Output

from ..engine import catalog
from ..engine.artifacts.manifest import AdapterManifest, write_manifest
from ..engine.pipeline import Pipeline
from ..engine.pipeline.definition import resolve_path
from ..engine.stages.merge_adapters.inputs import combine_inputs
from ..engine.stages.merge_adapters.settings import MergeAdapters
from .metadata import as_metadata
from .mlflow_runs import PROFILE_TAG
from .stage_runs import stage_run


def input_name(stage: str) -> str:
    """The asset input that carries the artifact of an adapter stage it combines."""
    return f"adapter_{stage}"


def input_artifacts(pipeline: Pipeline, stage: MergeAdapters, inputs: dict[str, str]) -> list[str]:
    """Each input's artifact directory, in the settings' order: a stage's from the asset's inputs, an artifact's
    resolved against the pipeline's folder."""
    base = Path(pipeline.source_file).parent if pipeline.source_file else None
    return [
        inputs[input_name(ref.stage)] if ref.stage else str(resolve_path(ref.artifact, base)) for ref in stage.adapters
    ]


def run_combine_stage(
    context, pipeline: Pipeline, stage: MergeAdapters, inputs: dict[str, str], store, tracking, training
):
    artifacts = input_artifacts(pipeline, stage, inputs)
    try:
        job_inputs, manifests = combine_inputs(stage, artifacts)
    except ValueError as exc:  # ManifestError too: an artifact path that holds no adapter
        raise Failure(description=f"{stage.name}: {exc}") from exc
    first = manifests[0]
    run_id = context.op_execution_context.run_id
    with stage_run(
        context,
        pipeline,
        tracking,
        stage.name,
        {
            "pipeline": pipeline.name,
            "stage": stage.name,
            "method": stage.kind,
            "kind": stage.kind,
            "asset_key": context.asset_key.to_user_string(),
            "dagster_run_id": run_id,
            "base_model": first.base_model,
            **{f"input.{m.stage}.mlflow_run_id": m.mlflow_run_id for m in manifests if m.mlflow_run_id},
        },
        {"model": first.resolved_model, **stage.model_dump()},
        f"The adapters of {', '.join(job_inputs.labels)} combined by PEFT's add_weighted_adapter "
        f"({stage.combination}) into one adapter on `{first.base_model}`.",
    ) as run:
        with store.new_artifact(pipeline.name, stage.name, run_id) as (tmp, final):
            job = catalog.kind_of(stage).job_model()(settings=stage, inputs=job_inputs, output_dir=str(tmp))
            result = training.run_job(context, job, tmp, store=store, final=final)
            write_manifest(
                tmp,
                AdapterManifest[type(result)](
                    stage=stage.name,
                    method=stage.kind,
                    base_model=first.base_model,
                    resolved_model=first.resolved_model,
                    chain=[*job_inputs.before, str(final / "adapter")],
                    dataset="",  # trained on no dataset: the inputs' manifests say theirs
                    settings=stage,
                    mlflow_run_id=run.id,
                    upstream_mlflow_run_id=first.mlflow_run_id,
                    dagster_run_id=run_id,
                    result=result,
                ),
            )
            tracking.log_artifacts(run.id, [tmp / "manifest.json", tmp / "adapter" / "adapter_config.json"])
    return Output(
        str(final),
        metadata={
            "artifact_dir": MetadataValue.path(str(final)),
            "mlflow_run_id": run.id,
            "mlflow_run": MetadataValue.url(tracking.run_url(pipeline.name, run.id)),
            "profile": context.run.tags.get(PROFILE_TAG) or "none",
            **as_metadata(result.metadata()),
        },
    )
