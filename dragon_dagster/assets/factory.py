"""Turn a pipeline into Dagster assets, checks and a job, keys prefixed by the pipeline name.

Each stage's asset is built by its kind's role (registry.KINDS); its launchpad config comes from the kind's
settings model. Assets hand each other paths of immutable artifact directories; each directory holds a
manifest.json saying what made it (settings, inputs, Dagster run, MLflow run) and the files that reproduce it.
"""

import shutil
from contextlib import contextmanager
from pathlib import Path

from dagster import (
    AssetIn,
    AssetKey,
    AssetSelection,
    Failure,
    MetadataValue,
    Output,
    asset,
    define_asset_job,
    multiprocess_executor,
)

from ..engine import models
from ..engine.artifacts import read_manifest, sha256, write_manifest
from ..engine.data import tables as data_lib
from ..engine.spec import stages as st
from ..engine.spec.pipeline import Pipeline
from ..engine.spec.registry import KINDS
from ..resources import ArtifactStore, MLflowTracking, TrainingResource
from .adapter_stage import run_training_stage
from .checks import build_checks
from .export_stage import run_export_stage
from .launchpad import RESUME, effective, launchpad_config
from .metadata import length_stats, md_table
from .registry import register_merged_model
from .report_stage import run_report_stage

TRAINING_POOL = "training"
# The pool is held per run (dagster.yaml: a waiting run stays queued, no process); inside one run, the same tag
# keeps two pooled steps (the main chain and the feedback branch, say) from running at once.
POOL_TAGS = {"dragon/pool": TRAINING_POOL}
POOL_EXECUTOR = multiprocess_executor.configured(
    {"tag_concurrency_limits": [{"key": "dragon/pool", "value": TRAINING_POOL, "limit": 1}]}, name="pool_executor"
)
PIPELINE_METADATA = "dragon/pipeline"  # on each pipeline's job: its effective settings and source file
USER_ERRORS = (data_lib.DataError, models.ModelError, ValueError)


@contextmanager
def named_failure(what: str):
    """Bad input becomes a Dagster Failure whose description names the problem, not a stack trace."""
    try:
        yield
    except USER_ERRORS as exc:
        raise Failure(description=f"{what}: {exc}") from exc


def key(pipeline: Pipeline, name: str) -> AssetKey:
    return AssetKey([pipeline.name, name])


def ins_for(pipeline: Pipeline, stage: st.Stage, *names: str, upstream: list[str] | None = None) -> dict[str, AssetIn]:
    """The stage's upstream assets under the parameter names its asset function takes, in order. upstream:
    for stages outside the pipeline's list (feedback retraining), the assets they read."""
    upstream = upstream or pipeline.upstream(stage.name)
    return {name: AssetIn(key=key(pipeline, asset_name)) for name, asset_name in zip(names, upstream)}


def source_asset(pipeline: Pipeline, name: str, spec):
    @asset(
        key=key(pipeline, name),
        group_name=pipeline.name,
        kinds={"dataset"},
        description=f"Source data read from {spec.path}: a snapshot copy, so later edits of the file "
        "do not change what a run trained on.",
    )
    def _source(context, store: ArtifactStore) -> Output[str]:
        with named_failure(f"{pipeline.name}/{name}"):
            df = data_lib.read_table(spec.path, spec.format)
        src = Path(spec.path)
        with store.new_artifact(pipeline.name, name, context.run_id) as (tmp, final):
            target = tmp / ("data" if src.is_dir() else f"data{src.suffix}")
            shutil.copytree(src, target) if src.is_dir() else shutil.copyfile(src, target)
            write_manifest(
                tmp,
                kind="source",
                source=str(src),
                file=target.name,
                rows=len(df),
                columns=list(df.columns),
                sha256=None if src.is_dir() else sha256(target),
                dagster_run_id=context.run_id,
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


def map_dataset(stage: st.DatasetStage, df, kept: list[int] | None = None) -> tuple[list[dict], dict]:
    """Rows for a dataset stage and what was dropped, by the stage's kind. kept: gets the source position of each
    pair kept (the other kinds keep every row)."""
    if isinstance(stage, st.PairsDataset):
        return data_lib.map_pairs(
            df, data_lib.PairsMapping(stage.prompt, stage.chosen, stage.rejected, stage.system), kept
        )
    if isinstance(stage, st.RatedDataset):
        return data_lib.map_rated(df, data_lib.RatedMapping(stage.prompt, stage.reply, stage.label, stage.system), kept)
    if isinstance(stage, st.PromptDataset):
        return data_lib.map_prompts(df, data_lib.PromptsMapping(stage.prompt, stage.reference, stage.system)), {}
    return data_lib.map_rows(df, data_lib.Mapping(stage.prompt, stage.response, stage.system, stage.conversations)), {}


def preview_row(row: dict) -> dict:
    out = {"prompt": data_lib.user_text(row)}
    for column in ("completion", "chosen", "rejected"):
        if column in row:
            out[column] = row[column][-1]["content"]
    if "reference" in row:
        out["reference"] = row["reference"]
    if "label" in row:
        out["label"] = "liked" if row["label"] else "disliked"
    return out


def read_source(pipeline: Pipeline, stage: st.DatasetStage, source: str | None):
    """The stage's table: from its source asset's snapshot, or from its own path."""
    if source is None:
        return data_lib.read_table(stage.path, stage.format)
    manifest = read_manifest(source)
    return data_lib.read_table(Path(source) / manifest["file"], stage.format or pipeline.datasets[stage.source].format)


def dataset_asset(pipeline: Pipeline, stage: st.DatasetStage):
    mapped = ", ".join(
        f"{k} {getattr(stage, k)!r}"
        for k in ("prompt", "response", "chosen", "rejected", "reply", "label", "reference", "conversations")
        if getattr(stage, k, None)
    )

    @asset(
        key=key(pipeline, stage.name),
        group_name=pipeline.name,
        kinds={"dataset"},
        ins=ins_for(pipeline, stage, "source"),
        description=f"{stage.kind.replace('_', ' ').capitalize()} mapped from {stage.source or stage.path} "
        f"({mapped}), split into train and held-out files.",
    )
    def _dataset(context, config: launchpad_config(stage), store: ArtifactStore, **inputs) -> Output[str]:
        settings = effective(stage, config)
        with named_failure(f"{pipeline.name}/{stage.name}"):
            inputs = local_inputs(store, inputs)
            df = read_source(pipeline, settings, inputs.get("source"))
            kept: list[int] = []
            rows, dropped = map_dataset(settings, df, kept)
            if settings.group_by:  # read from the source table, carried along with the rows it maps to
                values = data_lib.group_values(df, settings.group_by)
                groups = (
                    [values[i] for i in kept] if isinstance(settings, (st.PairsDataset, st.RatedDataset)) else values
                )
            else:  # rows asking the same prompt stay on one side
                groups = [data_lib.user_text(r) for r in rows]
            duplicates = 0
            if settings.dedupe:
                rows, groups, duplicates = data_lib.dedupe_rows(rows, groups)
            train, held = data_lib.split_rows(rows, settings.eval_frac, settings.seed, groups)
            leakage = data_lib.overlap(train, held)
            tokenizer = models.load_tokenizer(models.check_loadable(pipeline.model))
        lengths = [chat_tokens(tokenizer, r) for r in rows]
        quality = data_lib.quality(rows)
        with store.new_artifact(pipeline.name, stage.name, context.run_id) as (tmp, final):
            data_lib.write_jsonl(tmp / "train.jsonl", train)
            data_lib.write_jsonl(tmp / "eval.jsonl", held)
            if not inputs:  # keep the file it was read from, so the artifact reproduces itself
                shutil.copyfile(settings.path, tmp / f"source{Path(settings.path).suffix}")
            write_manifest(
                tmp,
                kind=stage.kind,
                source=inputs.get("source") or settings.path,
                settings=settings.model_dump(),
                train_rows=len(train),
                eval_rows=len(held),
                dropped=dropped,
                quality=quality,
                duplicates_dropped=duplicates,
                **leakage,
                group_by=settings.group_by or "the user prompt",
                dagster_run_id=context.run_id,
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
            },
        )

    return _dataset


def training_asset(pipeline: Pipeline, stage: st.TrainerStage):
    upstream = pipeline.upstream(stage.name)

    @asset(
        key=key(pipeline, stage.name),
        group_name=pipeline.name,
        kinds={"pytorch", "mlflow"},
        ins=ins_for(pipeline, stage, "dataset", "previous"),
        pool=TRAINING_POOL,
        op_tags=POOL_TAGS,
        description=f"LoRA adapter trained with TRL ({stage.objective().upper()}) on {upstream[0]}"
        + (f", continuing from {upstream[1]}" if len(upstream) > 1 else "")
        + ".",
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
        return run_training_stage(
            context,
            pipeline,
            effective(stage, config),
            inputs["dataset"],
            inputs.get("previous"),
            config.resume,
            store,
            tracking,
            training,
        )

    return _train


def synthesis_asset(pipeline: Pipeline, stage: st.PreferencePairs | st.SyntheticDataset):
    """Data made by models (a teacher, the student, a judge): generated in the worker, counted by reason."""
    upstream = pipeline.upstream(stage.name)

    @asset(
        key=key(pipeline, stage.name),
        group_name=pipeline.name,
        kinds={"dataset", "pytorch"},
        ins=ins_for(pipeline, stage, "dataset", "student"),
        pool=TRAINING_POOL,
        op_tags=POOL_TAGS,
        description=f"{stage.kind.replace('_', ' ').capitalize()} made from {upstream[0]}'s prompts"
        + (f" with {upstream[1]} as the student" if len(upstream) > 1 else "")
        + ".",
    )
    def _synthesize(
        context, config: launchpad_config(stage), store: ArtifactStore, training: TrainingResource, **inputs
    ) -> Output[str]:
        settings = effective(stage, config)
        inputs = local_inputs(store, inputs)
        job = {"settings": settings.model_dump(), "prompts_file": str(Path(inputs["dataset"]) / "train.jsonl")}
        if "student" in inputs:
            student = read_manifest(inputs["student"])
            job.update(model=student["resolved_model"], adapters=student["chain"])
        with store.new_artifact(pipeline.name, stage.name, context.run_id) as (tmp, final):
            job["output_dir"] = str(tmp)
            result = training.run_job(context, job, tmp, store=store, final=final)
            write_manifest(
                tmp,
                kind=stage.kind,
                dataset=inputs["dataset"],
                student=inputs.get("student"),
                settings=settings.model_dump(),
                result=result,
                dagster_run_id=context.run_id,
            )
        return Output(
            str(final),
            metadata={
                "artifact_dir": MetadataValue.path(str(final)),
                "kept": result["kept"],
                "train_rows": result["train_rows"],
                "eval_rows": result["eval_rows"],
                **{f"dropped_{k}": v for k, v in result["dropped"].items()},
                "preview": md_table(result["preview"]),
            },
        )

    return _synthesize


def merge_asset(pipeline: Pipeline, stage: st.Merge, upstream: list[str] | None = None):
    @asset(
        key=key(pipeline, stage.name),
        group_name=pipeline.name,
        kinds={"pytorch"},
        pool=TRAINING_POOL,
        op_tags=POOL_TAGS,
        ins=ins_for(pipeline, stage, "adapter", upstream=upstream),
        description="The adapter chain folded into the base model: a standalone model directory that "
        "plain transformers loads.",
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
        adapter_manifest = read_manifest(adapter)
        job = {
            "settings": settings.model_dump(),
            "model": adapter_manifest["resolved_model"],
            "adapters": adapter_manifest["chain"],
        }
        with store.new_artifact(pipeline.name, stage.name, context.run_id) as (tmp, final):
            job["output_dir"] = str(tmp)
            info = training.run_job(context, job, tmp, store=store, final=final)
            info["model_dir"] = str(final / "model")
            write_manifest(
                tmp,
                kind="merged_model",
                base_model=adapter_manifest["base_model"],
                resolved_model=adapter_manifest["resolved_model"],
                adapters=adapter_manifest["chain"],
                upstream_mlflow_run_id=adapter_manifest.get("mlflow_run_id"),
                info=info,
                settings=settings.model_dump(),
                dagster_run_id=context.run_id,
            )
        # after the artifact is published: a registry that fails cannot take the merged model with it
        version = register_merged_model(context, pipeline, tracking, final)
        return Output(
            str(final),
            metadata={
                "artifact_dir": MetadataValue.path(str(final)),
                "model_dir": MetadataValue.path(info["model_dir"]),
                "size_mb": info["size_mb"],
                "parameters": info["parameters"],
                "registered_model": MetadataValue.text(f"models:/{pipeline.name}/{version} (challenger)"),
                "sample": MetadataValue.md(f"**{info['sample_prompt']}**\n\n{info['sample_reply']}"),
            },
        )

    return _merge


def evaluate_asset(pipeline: Pipeline, stage: st.Evaluate, upstream: list[str] | None = None):
    @asset(
        key=key(pipeline, stage.name),
        group_name=pipeline.name,
        kinds={"mlflow"},
        pool=TRAINING_POOL,
        op_tags=POOL_TAGS,
        ins=ins_for(pipeline, stage, "merged", "dataset", upstream=upstream),
        description="Base model against the merged model on the same held-out rows: loss, perplexity, "
        "task metrics and sample replies side by side.",
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
        return run_report_stage(
            context,
            pipeline,
            effective(stage, config),
            str(store.local(merged)),
            str(store.local(dataset)),
            store,
            tracking,
            training,
        )

    return _evaluate


def export_asset(pipeline: Pipeline, stage: st.Export, upstream: list[str] | None = None):
    upstream = upstream or pipeline.upstream(stage.name)

    @asset(
        key=key(pipeline, stage.name),
        group_name=pipeline.name,
        kinds={"gguf"},
        pool=TRAINING_POOL,
        op_tags=POOL_TAGS,
        ins=ins_for(pipeline, stage, "merged", "report", upstream=upstream),
        description=f"{upstream[0]} as GGUF files ({', '.join(stage.formats)}) for llama.cpp and Ollama, with "
        "an Ollama Modelfile and a model card"
        + (f" that includes {upstream[1]}'s table" if len(upstream) > 1 else "")
        + ".",
    )
    def _export(
        context, config: launchpad_config(stage), store: ArtifactStore, training: TrainingResource, **inputs
    ) -> Output[str]:
        inputs = local_inputs(store, inputs)
        with named_failure(f"{pipeline.name}/{stage.name}"):
            return run_export_stage(
                context, pipeline, effective(stage, config), inputs["merged"], inputs.get("report"), store, training
            )

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


def build_pipeline_defs(pipeline: Pipeline) -> dict:
    """Assets, asset checks, jobs, sensors and schedules of one pipeline."""
    assets = [source_asset(pipeline, name, spec) for name, spec in pipeline.datasets.items()]
    assets += [BUILDERS[KINDS[stage.kind].role](pipeline, stage) for stage in pipeline.stages]
    names = [*pipeline.datasets, *(s.name for s in pipeline.stages)]
    job = define_asset_job(
        f"{pipeline.name}_pipeline",
        selection=AssetSelection.assets(*[key(pipeline, n) for n in names]),
        description=pipeline.description or f"Every stage of the {pipeline.name} pipeline.",
        executor_def=POOL_EXECUTOR,
        metadata={
            PIPELINE_METADATA: MetadataValue.json(
                {"settings": pipeline.model_dump(mode="json"), "source_file": pipeline.source_file}
            )
        },
    )
    parts = {"assets": assets, "asset_checks": build_checks(pipeline), "jobs": [job], "sensors": [], "schedules": []}
    if pipeline.feedback is not None:
        from .feedback import build_feedback_defs

        for name, values in build_feedback_defs(pipeline).items():
            parts[name] += values
    return parts
