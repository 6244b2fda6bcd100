"""The asset of each stage, built by its kind's role (engine/catalog.py); keys prefixed by the pipeline name.

Its launchpad config comes from the kind's settings model. Assets hand each other paths of immutable artifact
directories; each directory holds a manifest.json saying what made it (settings, inputs, Dagster run, MLflow
run) and the files that reproduce it.
"""

import shutil
from contextlib import contextmanager
from pathlib import Path

from dagster import AssetIn, AssetKey, Failure, MetadataValue, Output, asset

from ..engine import catalog, models
from ..engine.artifacts.directories import sha256
from ..engine.artifacts.manifest import (
    AdapterManifest,
    DatasetManifest,
    MergedManifest,
    SourceManifest,
    SynthesisManifest,
    read_manifest,
    write_manifest,
)
from ..engine.config.job import ModelInputs, SynthesisInputs
from ..engine.config.stage import Stage
from ..engine.data import errors, row_parts, tables
from ..engine.data.prepare import prepare
from ..engine.data.stage import DatasetStage
from ..engine.pipeline import Pipeline
from ..engine.pipeline.versions import file_version, stage_version
from ..engine.stages.evaluate.settings import Evaluate
from ..engine.stages.export.settings import Export
from ..engine.stages.merge.settings import Merge
from ..engine.train.stage import TrainerStage
from ..resources import ArtifactStore, MLflowTracking, TrainingResource
from .export import default_system, run_export_stage
from .launchpad import RESUME, effective, launchpad_config
from .metadata import as_metadata, length_stats, md_table
from .mlflow_runs import PROFILE_TAG
from .pool import POOL_TAGS, TRAINING_POOL
from .promotion import register_merged_model
from .prompts import live_system, register_dataset_prompt
from .report import run_report_stage
from .reuse import reuse_or_make
from .stage_inputs import asset_ins, by_role, declared_ins
from .stage_runs import stage_run
from .training import run_training_stage

USER_ERRORS = (errors.DataError, models.ModelError, ValueError)


@contextmanager
def named_failure(what: str):
    """Bad input becomes a Dagster Failure whose description names the problem, not a stack trace."""
    try:
        yield
    except USER_ERRORS as exc:
        raise Failure(description=f"{what}: {exc}") from exc


def training_group(pipeline: Pipeline) -> str:
    """The asset group of the pipeline's own stages: "Materialize all" in it never starts a retraining."""
    return f"{pipeline.name}_training"


def retraining_group(pipeline: Pipeline) -> str:
    """The asset group of the retraining from chat feedback (assets/retraining.py)."""
    return f"{pipeline.name}_retraining"


def key(pipeline: Pipeline, name: str) -> AssetKey:
    return AssetKey([pipeline.name, name])


def ins_for(pipeline: Pipeline, stage: Stage, *names: str, upstream: list[str] | None = None) -> dict[str, AssetIn]:
    """The stage's upstream assets under the parameter names its asset function takes, in order. upstream:
    for stages outside the pipeline's list (feedback retraining), the assets they read."""
    upstream = upstream or pipeline.upstream(stage.name)
    return {name: AssetIn(key=key(pipeline, asset_name)) for name, asset_name in zip(names, upstream)}


def source_asset(pipeline: Pipeline, name: str, spec):
    @asset(
        key=key(pipeline, name),
        group_name=training_group(pipeline),
        kinds={"dataset"},
        description=f"Source data read from {spec.path}: a snapshot copy, so later edits of the file "
        "do not change what a run trained on. Its version is the file's content: an edit makes it, and "
        "everything made from it, unsynced.",
        code_version=f"file:{file_version(spec.path)}",
    )
    def _source(context, store: ArtifactStore) -> Output[str]:
        # the content as it is now (the definitions may have loaded before an edit): an edited file is read anew
        version = f"file:{file_version(spec.path)}"
        return reuse_or_make(context, pipeline, None, {}, lambda: _snapshot(context, store), version=version)

    def _snapshot(context, store: ArtifactStore) -> Output[str]:
        with named_failure(f"{pipeline.name}/{name}"):
            df = tables.read_table(spec.path, spec.format)
        src = Path(spec.path)
        with store.new_artifact(pipeline.name, name, context.op_execution_context.run_id) as (tmp, final):
            target = tmp / ("data" if src.is_dir() else f"data{src.suffix}")
            shutil.copytree(src, target) if src.is_dir() else shutil.copyfile(src, target)
            write_manifest(
                tmp,
                SourceManifest(
                    source=str(src),
                    file=target.name,
                    rows=len(df),
                    columns=[str(c) for c in df.columns],
                    sha256=None if src.is_dir() else sha256(target),
                    dagster_run_id=context.op_execution_context.run_id,
                ),
            )
        return Output(
            str(final),
            metadata={
                "artifact_dir": MetadataValue.path(str(final)),
                "rows": len(df),
                "columns": ", ".join(map(str, df.columns)),
                "preview": md_table(df.head(5).to_dict(orient="records")),
            },
        )

    return _source


def preview_row(row: dict) -> dict:
    out = {"prompt": row_parts.user_text(row)}
    for column in ("completion", "chosen", "rejected"):
        if column in row:
            out[column] = row[column][-1]["content"]
    if "reference" in row:
        out["reference"] = row["reference"]
    if "label" in row:
        out["label"] = "liked" if row["label"] else "disliked"
    return out


def read_source(pipeline: Pipeline, stage: DatasetStage, source: str | None):
    """The stage's table: from its source asset's snapshot, or from its own path."""
    if source is None:
        return tables.read_table(stage.path, stage.format)
    manifest = read_manifest(source, SourceManifest)
    return tables.read_table(Path(source) / manifest.file, stage.format or pipeline.datasets[stage.source].format)


def dataset_asset(pipeline: Pipeline, stage: DatasetStage):
    mapped = ", ".join(f"{k} {v!r}" for k, v in stage.mapped_columns().items() if k != "system")

    @asset(
        key=key(pipeline, stage.name),
        group_name=training_group(pipeline),
        kinds={"dataset"},
        ins=ins_for(pipeline, stage, "source"),
        description=f"{stage.kind.replace('_', ' ').capitalize()} mapped from {stage.source or stage.path} "
        f"({mapped}), split into train and held-out files.",
        code_version=stage_version(pipeline, stage),
    )
    def _dataset(
        context, config: launchpad_config(stage), store: ArtifactStore, tracking: MLflowTracking, **inputs
    ) -> Output[str]:
        settings = effective(stage, config)
        inputs = local_inputs(store, inputs)
        return reuse_or_make(
            context, pipeline, settings, inputs, lambda: _map(context, settings, store, tracking, inputs), tracking
        )

    def _map(context, settings, store: ArtifactStore, tracking: MLflowTracking, inputs: dict) -> Output[str]:
        with named_failure(f"{pipeline.name}/{stage.name}"):
            df = read_source(pipeline, settings, inputs.get("source"))
            prepared = prepare(settings, df)
            tokenizer = models.load_tokenizer(models.check_loadable(pipeline.model))
        train, held, dropped, duplicates = prepared.train, prepared.held, prepared.dropped, prepared.duplicates
        leakage, quality = prepared.leakage, prepared.quality
        lengths = [chat_tokens(tokenizer, r) for r in prepared.rows]
        prompt_uri = register_dataset_prompt(pipeline, stage.name, getattr(settings, "system", None), tracking)
        with store.new_artifact(pipeline.name, stage.name, context.op_execution_context.run_id) as (tmp, final):
            tables.write_jsonl(tmp / "train.jsonl", train)
            tables.write_jsonl(tmp / "eval.jsonl", held)
            if not inputs:  # keep the file it was read from, so the artifact reproduces itself
                shutil.copyfile(settings.path, tmp / f"source{Path(settings.path).suffix}")
            write_manifest(
                tmp,
                DatasetManifest(
                    kind=stage.kind,
                    source=inputs.get("source") or settings.path,
                    settings=settings,
                    train_rows=len(train),
                    eval_rows=len(held),
                    dropped=dropped,
                    quality=quality,
                    duplicates_dropped=duplicates,
                    **leakage,
                    group_by=settings.group_by or "the user prompt",
                    system_prompt_uri=prompt_uri,
                    dagster_run_id=context.op_execution_context.run_id,
                ),
            )
        return Output(
            str(final),
            metadata={
                "artifact_dir": MetadataValue.path(str(final)),
                "train_rows": len(train),
                "eval_rows": len(held),
                "duplicates_dropped": duplicates,
                **leakage,
                "preview": md_table([preview_row(r) for r in train[:5]]),
                "tokens": MetadataValue.json(length_stats(lengths)),
                "duplicate_share": quality["duplicate_share"],
                **{f"dropped_{k}": v for k, v in dropped.items()},
                **({"system_prompt": MetadataValue.text(prompt_uri)} if prompt_uri else {}),
            },
        )

    return _dataset


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


def synthesis_asset(pipeline: Pipeline, stage: Stage):
    """Data made by models (a teacher, the student, a judge): generated in the worker, counted by reason."""
    upstream = pipeline.upstream(stage.name)

    @asset(
        key=key(pipeline, stage.name),
        group_name=training_group(pipeline),
        kinds={"dataset", "pytorch"},
        ins=ins_for(pipeline, stage, "dataset", "student"),
        pool=TRAINING_POOL,
        op_tags=POOL_TAGS,
        description=f"{stage.kind.replace('_', ' ').capitalize()} made from {upstream[0]}'s prompts"
        + (f" with {upstream[1]} as the student" if len(upstream) > 1 else "")
        + ".",
        code_version=stage_version(pipeline, stage),
    )
    def _synthesize(
        context,
        config: launchpad_config(stage),
        store: ArtifactStore,
        training: TrainingResource,
        tracking: MLflowTracking,
        **inputs,
    ) -> Output[str]:
        settings = effective(stage, config)
        inputs = local_inputs(store, inputs)
        return reuse_or_make(
            context, pipeline, settings, inputs, lambda: _generate(context, settings, store, training, inputs), tracking
        )

    def _generate(context, settings, store: ArtifactStore, training: TrainingResource, inputs: dict) -> Output[str]:
        student = read_manifest(inputs["student"], AdapterManifest) if "student" in inputs else None
        job_inputs = SynthesisInputs(
            prompts_file=str(Path(inputs["dataset"]) / "train.jsonl"),
            model=student.resolved_model if student else None,
            adapters=student.chain if student else [],
        )
        with store.new_artifact(pipeline.name, stage.name, context.op_execution_context.run_id) as (tmp, final):
            job = catalog.kind_of(stage).job_model()(settings=settings, inputs=job_inputs, output_dir=str(tmp))
            result = training.run_job(context, job, tmp, store=store, final=final)
            write_manifest(
                tmp,
                SynthesisManifest(
                    kind=stage.kind,
                    dataset=inputs["dataset"],
                    student=inputs.get("student"),
                    settings=settings,
                    result=result,
                    dagster_run_id=context.op_execution_context.run_id,
                ),
            )
        return Output(
            str(final), metadata={"artifact_dir": MetadataValue.path(str(final)), **as_metadata(result.metadata())}
        )

    return _synthesize


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


def local_inputs(store: ArtifactStore, inputs: dict) -> dict:
    """Upstream artifacts as local directories: fetched from the store's artifact_uri when this machine has no
    copy (a step on another node than the one that made them)."""
    return {name: str(store.local(path)) for name, path in inputs.items()}


def chat_tokens(tokenizer, row: dict) -> int:
    reply = row.get("completion") or row.get("chosen") or []  # a bare prompt row has no reply
    text = tokenizer.apply_chat_template(row["prompt"] + reply, tokenize=False, add_generation_prompt=not reply)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


BUILDERS = {
    "dataset": dataset_asset,
    "synthesis": synthesis_asset,
    "training": training_asset,
    "merge": merge_asset,
    "evaluate": evaluate_asset,
    "export": export_asset,
}
