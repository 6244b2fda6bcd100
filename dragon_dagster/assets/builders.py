"""The asset of each stage, built by its kind's role (engine/catalog.py; `BUILDERS`): training, merge, evaluation
and export here, the data-making ones in data_assets.py; their keys, groups and inputs from asset_wiring.py.

Its launchpad config comes from the kind's settings model. Assets hand each other paths of immutable artifact
directories; each directory holds a manifest.json saying what made it (settings, inputs, Dagster run, MLflow
run) and the files that reproduce it.
"""

from pathlib import Path

from dagster import AssetIn, MetadataValue, Output, asset

from ..engine import catalog
from ..engine.artifacts.manifest import AdapterManifest, MergedManifest, read_manifest, write_manifest
from ..engine.config.job import ModelInputs
from ..engine.pipeline import Pipeline
from ..engine.pipeline.versions import stage_version
from ..engine.stages.evaluate.settings import Evaluate
from ..engine.stages.export.settings import Export
from ..engine.stages.merge.settings import Merge
from ..engine.stages.merge_adapters.settings import MergeAdapters
from ..engine.train.stage import TrainerStage
from ..resources import ArtifactStore, MLflowTracking, TrainingResource
from .asset_wiring import ins_for, key, local_inputs, named_failure, training_group
from .combine import input_name, run_combine_stage
from .data_assets import dataset_asset, synthesis_asset
from .export import default_system, run_export_stage
from .launchpad import RESUME, effective, launchpad_config
from .mlflow_runs import PROFILE_TAG
from .pool import POOL_TAGS, TRAINING_POOL
from .promotion import register_merged_model
from .prompts import live_system
from .report import run_report_stage
from .reuse import reuse_or_make
from .stage_inputs import asset_ins, by_role, declared_ins
from .stage_runs import stage_run
from .training import run_training_stage


def training_ins(pipeline: Pipeline, stage: TrainerStage) -> dict[str, AssetIn]:
    """A training asset's inputs: its dataset, the stages its kind declares (the reward models that score its
    samples ...: stage_inputs.py), and the training stage it continues from."""
    ins = {"dataset": AssetIn(key=key(pipeline, stage.dataset))}
    ins.update(asset_ins(declared_ins(pipeline, stage)))
    previous = pipeline.previous(stage.name)
    if previous is not None:
        ins["previous"] = AssetIn(key=key(pipeline, previous))
    return ins


def training_asset(pipeline: Pipeline, stage: TrainerStage):
    previous = pipeline.previous(stage.name)
    scorers = stage.scorers()
    declared = declared_ins(pipeline, stage)

    @asset(
        key=key(pipeline, stage.name),
        group_name=training_group(pipeline),
        kinds={"pytorch", "mlflow"},
        ins=training_ins(pipeline, stage),
        pool=TRAINING_POOL,
        op_tags=POOL_TAGS,
        description=f"LoRA adapter trained with TRL ({stage.objective().upper()}) on {stage.dataset}"
        + (f", scored by the reward model of {', '.join(scorers)}" if scorers else "")
        + (f", continuing from {previous}" if previous else "")
        + ".",
        code_version=stage_version(pipeline, stage),
    )
    def _train(
        context,
        config: launchpad_config(stage, resume=RESUME),
        store: ArtifactStore,
        tracking: MLflowTracking,
        training: TrainingResource,
        **inputs,
    ) -> Output[str]:
        inputs = local_inputs(store, inputs)
        settings = effective(stage, config)
        return reuse_or_make(
            context,
            pipeline,
            settings,
            inputs,
            lambda: run_training_stage(
                context,
                pipeline,
                settings,
                inputs["dataset"],
                inputs.get("previous"),
                config.resume,
                store,
                tracking,
                training,
                declared=by_role(declared, inputs),
            ),
            tracking,
            allow=not config.resume,  # a resumed run continues its checkpoint: never a reuse
        )

    return _train


def combine_asset(pipeline: Pipeline, stage: MergeAdapters):
    """Adapters combined into one: an input (a lineage edge) from each adapter stage it names."""
    combined = ", ".join(ref.label for ref in stage.adapters)

    @asset(
        key=key(pipeline, stage.name),
        group_name=training_group(pipeline),
        kinds={"pytorch", "mlflow"},
        ins={input_name(name): AssetIn(key=key(pipeline, name)) for name in stage.stages()},
        pool=TRAINING_POOL,
        op_tags=POOL_TAGS,
        description=f"LoRA adapter combined from {combined} by PEFT's add_weighted_adapter ({stage.combination}).",
        code_version=stage_version(pipeline, stage),
    )
    def _combine(
        context,
        config: launchpad_config(stage),
        store: ArtifactStore,
        tracking: MLflowTracking,
        training: TrainingResource,
        **inputs,
    ) -> Output[str]:
        inputs = local_inputs(store, inputs)
        settings = effective(stage, config)
        return reuse_or_make(
            context,
            pipeline,
            settings,
            {**inputs, **{f"artifact_{i}": ref.artifact for i, ref in enumerate(settings.adapters) if ref.artifact}},
            lambda: run_combine_stage(context, pipeline, settings, inputs, store, tracking, training),
            tracking,
        )

    return _combine


def merge_asset(pipeline: Pipeline, stage: Merge, upstream: list[str] | None = None, group: str | None = None):
    @asset(
        key=key(pipeline, stage.name),
        group_name=group or training_group(pipeline),
        kinds={"pytorch"},
        pool=TRAINING_POOL,
        op_tags=POOL_TAGS,
        ins=ins_for(pipeline, stage, "adapter", upstream=upstream),
        description="The adapter chain folded into the base model: a standalone model directory that "
        "plain transformers loads.",
        code_version=stage_version(pipeline, stage),
    )
    def _merge(
        context,
        config: launchpad_config(stage),
        store: ArtifactStore,
        training: TrainingResource,
        tracking: MLflowTracking,
        adapter: str,
    ) -> Output[str]:
        settings = effective(stage, config)
        adapter = str(store.local(adapter))
        return reuse_or_make(
            context,
            pipeline,
            settings,
            {"adapter": adapter},
            lambda: _fold(context, settings, store, training, tracking, adapter),
            tracking,
        )

    def _fold(context, settings, store, training, tracking, adapter: str) -> Output[str]:
        adapter_manifest = read_manifest(adapter, AdapterManifest)
        inputs = ModelInputs(model=adapter_manifest.resolved_model, adapters=adapter_manifest.chain)
        chain = ", ".join(Path(a).parent.parent.name for a in adapter_manifest.chain)
        with stage_run(  # the run the registered version links to: it logs the merged model
            context,
            pipeline,
            tracking,
            stage.name,
            {
                "pipeline": pipeline.name,
                "stage": stage.name,
                "kind": "merge",
                "asset_key": context.asset_key.to_user_string(),
                "dagster_run_id": context.op_execution_context.run_id,
                "base_model": adapter_manifest.base_model,
                "upstream_mlflow_run_id": adapter_manifest.mlflow_run_id,
            },
            {
                "model": adapter_manifest.resolved_model,
                "adapters": len(adapter_manifest.chain),
                **settings.model_dump(),
            },
            f"The adapters of {chain} folded into `{adapter_manifest.base_model}`; the registered model version's "
            "source run.",
        ) as run:
            with store.new_artifact(pipeline.name, stage.name, context.op_execution_context.run_id) as (tmp, final):
                job = catalog.kind_of(stage).job_model()(settings=settings, inputs=inputs, output_dir=str(tmp))
                info = training.run_job(context, job, tmp, store=store, final=final)
                info = info.model_copy(update={"model_dir": str(final / "model")})  # where it is once published
                write_manifest(
                    tmp,
                    MergedManifest(
                        base_model=adapter_manifest.base_model,
                        resolved_model=adapter_manifest.resolved_model,
                        adapters=adapter_manifest.chain,
                        upstream_mlflow_run_id=adapter_manifest.mlflow_run_id,
                        mlflow_run_id=run.id,
                        info=info,
                        settings=settings,
                        dagster_run_id=context.op_execution_context.run_id,
                    ),
                )
                tracking.log_artifacts(run.id, [tmp / "manifest.json"])
            tracking.log_metrics(run.id, {"size_mb": info.size_mb, "parameters": info.parameters})
            # after the artifact is published: a registry that fails cannot take the merged model with it
            version = register_merged_model(context, pipeline, tracking, final)
        return Output(
            str(final),
            metadata={
                "artifact_dir": MetadataValue.path(str(final)),
                "model_dir": MetadataValue.path(info.model_dir),
                "size_mb": info.size_mb,
                "parameters": info.parameters,
                "registered_model": MetadataValue.text(f"models:/{pipeline.name}/{version} (challenger)"),
                "mlflow_run": MetadataValue.url(tracking.run_url(pipeline.name, run.id)),
                "profile": context.run.tags.get(PROFILE_TAG) or "none",
                "sample": MetadataValue.md(f"**{info.sample_prompt}**\n\n{info.sample_reply}"),
            },
        )

    return _merge


def evaluate_asset(pipeline: Pipeline, stage: Evaluate, upstream: list[str] | None = None):
    @asset(
        key=key(pipeline, stage.name),
        group_name=training_group(pipeline),
        kinds={"mlflow"},
        pool=TRAINING_POOL,
        op_tags=POOL_TAGS,
        ins=ins_for(pipeline, stage, "merged", "dataset", upstream=upstream),
        description="Base model against the merged model on the same held-out rows: loss, perplexity, "
        "task metrics and sample replies side by side.",
        code_version=stage_version(pipeline, stage),
    )
    def _evaluate(
        context,
        config: launchpad_config(stage),
        store: ArtifactStore,
        tracking: MLflowTracking,
        training: TrainingResource,
        merged: str,
        dataset: str,
    ) -> Output[str]:
        settings = effective(stage, config)
        inputs = {"merged": str(store.local(merged)), "dataset": str(store.local(dataset))}
        # the live system prompt is read as an input too: a new live version is evaluated anew
        live = live_system(pipeline, tracking, pipeline.system_prompt())[1]
        return reuse_or_make(
            context,
            pipeline,
            settings,
            {**inputs, "system_prompt": live or "none"},
            lambda: run_report_stage(
                context, pipeline, settings, inputs["merged"], inputs["dataset"], store, tracking, training
            ),
            tracking,
        )

    return _evaluate


def export_asset(pipeline: Pipeline, stage: Export, upstream: list[str] | None = None):
    upstream = upstream or pipeline.upstream(stage.name)

    @asset(
        key=key(pipeline, stage.name),
        group_name=training_group(pipeline),
        kinds={"gguf"},
        pool=TRAINING_POOL,
        op_tags=POOL_TAGS,
        ins=ins_for(pipeline, stage, "merged", "report", upstream=upstream),
        description=f"{upstream[0]} as GGUF files ({', '.join(stage.formats)}) for llama.cpp and Ollama, with "
        "an Ollama Modelfile and a model card"
        + (f" that includes {upstream[1]}'s table" if len(upstream) > 1 else "")
        + ".",
        code_version=stage_version(pipeline, stage),
    )
    def _export(
        context,
        config: launchpad_config(stage),
        store: ArtifactStore,
        training: TrainingResource,
        tracking: MLflowTracking,
        **inputs,
    ) -> Output[str]:
        inputs = local_inputs(store, inputs)
        settings = effective(stage, config)

        def make() -> Output[str]:
            with named_failure(f"{pipeline.name}/{stage.name}"):
                return run_export_stage(
                    context, pipeline, settings, inputs["merged"], inputs.get("report"), store, training, tracking
                )

        live = default_system(pipeline, settings, tracking)[1]  # a new live system prompt is exported anew
        return reuse_or_make(context, pipeline, settings, {**inputs, "system_prompt": live or "none"}, make, tracking)

    return _export


BUILDERS = {
    "dataset": dataset_asset,
    "synthesis": synthesis_asset,
    "training": training_asset,
    "merge_adapters": combine_asset,
    "merge": merge_asset,
    "evaluate": evaluate_asset,
    "export": export_asset,
}
