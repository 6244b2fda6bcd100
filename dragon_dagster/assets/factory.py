"""Turn a pipeline YAML into Dagster assets, checks and a job, keys prefixed by the pipeline name.

Assets hand each other paths of immutable artifact directories; each directory holds a manifest.json
saying what made it (settings, inputs, Dagster run, MLflow run) and the files that reproduce it.
"""

import shutil
from pathlib import Path

from contextlib import contextmanager

from dagster import (AssetIn, AssetKey, AssetSelection, Failure, MetadataValue, Output, asset, define_asset_job)

from ..engine import data as data_lib
from ..engine import models
from ..engine.artifacts import read_manifest, sha256, write_manifest
from ..engine.pipeline_spec import Pipeline, Stage
from ..engine.settings import merged
from ..resources import ArtifactStore, MLflowTracking, TrainingResource
from .checks import build_checks
from .config import (DatasetConfig, EvaluateConfig, GRPOStageConfig, MergeConfig, PairsConfig,
                     PreferenceStageConfig, SFTStageConfig, SyntheticConfig)
from .metadata import length_stats, md_table
from .training_stage import run_training_stage

TRAINING_POOL = "training"
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

def source_asset(pipeline: Pipeline, name: str, spec: dict):
    @asset(key=key(pipeline, name), group_name=pipeline.name, kinds={"dataset"},
           description=f"Source data read from {spec['path']}: a snapshot copy, so later edits of the file "
                       "do not change what a run trained on.")
    def _source(context, store: ArtifactStore) -> Output[str]:
        with named_failure(f"{pipeline.name}/{name}"):
            df = data_lib.read_table(spec["path"], spec.get("format"))
        src = Path(spec["path"])
        with store.new_artifact(pipeline.name, name, context.run_id) as (tmp, final):
            target = tmp / ("data" if src.is_dir() else f"data{src.suffix}")
            shutil.copytree(src, target) if src.is_dir() else shutil.copyfile(src, target)
            write_manifest(tmp, kind="source", source=str(src), file=target.name, rows=len(df),
                           columns=list(df.columns), sha256=None if src.is_dir() else sha256(target),
                           dagster_run_id=context.run_id)
        return Output(str(final), metadata={
            "artifact_dir": MetadataValue.path(str(final)), "rows": len(df), "columns": ", ".join(map(str, df.columns)),
            "preview": md_table(df.head(5).to_dict(orient="records"))})
    return _source

def map_dataset(kind: str, df, settings: dict) -> tuple[list[dict], dict]:
    """Rows for a dataset stage and what was dropped, by the stage's kind."""
    if kind == "pairs_dataset":
        return data_lib.map_pairs(df, data_lib.PairsMapping(settings.get("prompt"), settings.get("chosen"),
                                                            settings.get("rejected"), settings.get("system")))
    if kind == "prompt_dataset":
        return data_lib.map_prompts(df, data_lib.PromptsMapping(settings.get("prompt"), settings.get("reference"),
                                                                settings.get("system"))), {}
    mapping = data_lib.Mapping(settings.get("prompt"), settings.get("response"), settings.get("system"),
                               settings.get("conversations"))
    return data_lib.map_rows(df, mapping), {}


def preview_row(row: dict) -> dict:
    out = {"prompt": data_lib.user_text(row)}
    for column in ("completion", "chosen", "rejected"):
        if column in row:
            out[column] = row[column][-1]["content"]
    if "reference" in row:
        out["reference"] = row["reference"]
    return out


def read_source(pipeline: Pipeline, stage: Stage, source: str | None):
    """The stage's table: from its source asset's snapshot, or from its own path."""
    if source is None:
        return data_lib.read_table(stage.settings["path"], stage.settings.get("format"))
    manifest = read_manifest(source)
    source_name = stage.upstream[0]
    return data_lib.read_table(Path(source) / manifest["file"], pipeline.datasets[source_name].get("format"))


def dataset_asset(pipeline: Pipeline, stage: Stage):
    origin = stage.upstream[0] if stage.upstream else stage.settings["path"]
    ins = {"source": AssetIn(key=key(pipeline, stage.upstream[0]))} if stage.upstream else {}
    mapped = ", ".join(f"{k} {stage.settings[k]!r}" for k in ("prompt", "response", "chosen", "rejected", "reference",
                                                               "conversations") if k in stage.settings)

    @asset(key=key(pipeline, stage.name), group_name=pipeline.name, kinds={"dataset"}, ins=ins,
           description=f"{stage.kind.replace('_', ' ').capitalize()} mapped from {origin} ({mapped}), "
                       "split into train and held-out files.")
    def _dataset(context, config: DatasetConfig, store: ArtifactStore, **inputs) -> Output[str]:
        settings = merged(stage.settings, config.model_dump())
        with named_failure(f"{pipeline.name}/{stage.name}"):
            df = read_source(pipeline, stage, inputs.get("source"))
            rows, dropped = map_dataset(stage.kind, df, settings)
            train, held = data_lib.split_rows(rows, settings.get("eval_frac", 0.05), settings.get("seed", 42))
            tokenizer = models.load_tokenizer(models.check_loadable(pipeline.model))
        lengths = [chat_tokens(tokenizer, r) for r in rows]
        quality = data_lib.quality(rows)
        with store.new_artifact(pipeline.name, stage.name, context.run_id) as (tmp, final):
            data_lib.write_jsonl(tmp / "train.jsonl", train)
            data_lib.write_jsonl(tmp / "eval.jsonl", held)
            if not inputs:  # keep the file it was read from, so the artifact reproduces itself
                shutil.copyfile(settings["path"], tmp / f"source{Path(settings['path']).suffix}")
            write_manifest(tmp, kind=stage.kind, source=inputs.get("source") or settings["path"], settings=settings,
                           train_rows=len(train), eval_rows=len(held), dropped=dropped, quality=quality,
                           dagster_run_id=context.run_id)
        return Output(str(final), metadata={
            "artifact_dir": MetadataValue.path(str(final)), "train_rows": len(train), "eval_rows": len(held),
            "preview": md_table([preview_row(r) for r in train[:5]]), "tokens": MetadataValue.json(length_stats(lengths)),
            "duplicate_share": quality["duplicate_share"], **{f"dropped_{k}": v for k, v in dropped.items()}})
    return _dataset


STAGE_CONFIGS = {"sft": SFTStageConfig, "preference": PreferenceStageConfig, "grpo": GRPOStageConfig}
STAGE_DEFAULTS = {  # dragonfarm's defaults per stage (dragon_train_args / dragon_prefer / dragon_reinforce)
    "sft": {},
    "preference": {"args": {"learning_rate": 5e-5, "epochs": 2}},
    "grpo": {"args": {"learning_rate": 1e-5, "epochs": 1, "batch_size": 4, "grad_accum": 1, "save_steps": 20}},
}
EXTRAS = {"preference": {"method": "dpo", "beta": 0.1},
          "grpo": {"group_size": 4, "beta": 0.04, "temperature": 1.0, "max_eval_prompts": 64}}


def training_asset(pipeline: Pipeline, stage: Stage):
    ins = {"dataset": AssetIn(key=key(pipeline, stage.upstream[0]))}
    if len(stage.upstream) > 1:
        ins["previous"] = AssetIn(key=key(pipeline, stage.upstream[1]))
    method = stage.settings.get("method", "dpo") if stage.kind == "preference" else stage.kind
    config_class = STAGE_CONFIGS[stage.kind]

    @asset(key=key(pipeline, stage.name), group_name=pipeline.name, kinds={"pytorch", "mlflow"}, ins=ins,
           pool=TRAINING_POOL,
           description=f"LoRA adapter trained with TRL ({method.upper()}) on {stage.upstream[0]}"
                       + (f", continuing from {stage.upstream[1]}" if len(stage.upstream) > 1 else "") + ".")
    def _train(context, config: config_class, store: ArtifactStore, tracking: MLflowTracking,
               training: TrainingResource, **inputs) -> Output[str]:
        defaults = STAGE_DEFAULTS[stage.kind]
        overrides = config.model_dump()
        settings = {
            "lora": merged(stage.settings.get("lora"), config.lora()),
            "args": merged(merged(defaults.get("args"), stage.settings.get("args")), config.args()),
            "n_samples": config.n_samples or stage.settings.get("n_samples", 10),
            "max_new_tokens": config.max_new_tokens or stage.settings.get("max_new_tokens", 128),
        }
        for name, default in EXTRAS.get(stage.kind, {}).items():
            settings[name] = overrides.get(name) if overrides.get(name) is not None else stage.settings.get(name, default)
        if stage.kind == "grpo":
            settings["rewards"] = stage.settings.get("rewards") or []
        kind = settings.pop("method", None) or stage.kind
        return run_training_stage(context, pipeline, stage, kind, settings, inputs["dataset"], inputs.get("previous"),
                                  config.resume, store, tracking, training)
    return _train


SYNTHESIS = {  # stage kind -> (config class, worker job kind, settings the job takes)
    "preference_pairs": (PairsConfig, "preference_pairs",
                         ("mode", "teacher", "judge", "rubric", "n", "n_samples_per_prompt", "min_gap", "temperature",
                          "max_new_tokens", "eval_frac", "seed")),
    "synthetic_dataset": (SyntheticConfig, "synthetic_sft",
                          ("teacher", "system", "max_new_tokens", "temperature", "judge", "min_score", "rubric",
                           "dedupe", "near_dup_threshold", "min_chars", "max_chars", "min_alpha_ratio", "eval_frac",
                           "seed")),
}


def synthesis_asset(pipeline: Pipeline, stage: Stage):
    """Data made by models (a teacher, the student, a judge): generated in the worker, counted by reason."""
    config_class, job_kind, keys = SYNTHESIS[stage.kind]
    ins = {"dataset": AssetIn(key=key(pipeline, stage.upstream[0]))}
    if len(stage.upstream) > 1:
        ins["student"] = AssetIn(key=key(pipeline, stage.upstream[1]))

    @asset(key=key(pipeline, stage.name), group_name=pipeline.name, kinds={"dataset", "pytorch"}, ins=ins,
           pool=TRAINING_POOL,
           description=f"{stage.kind.replace('_', ' ').capitalize()} made from {stage.upstream[0]}'s prompts"
                       + (f" with {stage.upstream[1]} as the student" if len(stage.upstream) > 1 else "") + ".")
    def _synthesize(context, config: config_class, store: ArtifactStore, training: TrainingResource,
                    **inputs) -> Output[str]:
        settings = merged({k: v for k, v in stage.settings.items() if k in keys}, config.model_dump())
        job = {"kind": job_kind, "prompts_file": str(Path(inputs["dataset"]) / "train.jsonl"), **settings}
        if "student" in inputs:
            student = read_manifest(inputs["student"])
            job.update(model=student["resolved_model"], adapters=student["chain"])
        with store.new_artifact(pipeline.name, stage.name, context.run_id) as (tmp, final):
            job["output_dir"] = str(tmp)
            result = training.run_job(context, job, tmp)
            write_manifest(tmp, kind=stage.kind, dataset=inputs["dataset"], student=inputs.get("student"),
                           settings=settings, result=result, dagster_run_id=context.run_id)
        return Output(str(final), metadata={
            "artifact_dir": MetadataValue.path(str(final)), "kept": result["kept"],
            "train_rows": result["train_rows"], "eval_rows": result["eval_rows"],
            **{f"dropped_{k}": v for k, v in result["dropped"].items()}, "preview": md_table(result["preview"])})
    return _synthesize


def merge_asset(pipeline: Pipeline, stage: Stage):
    @asset(key=key(pipeline, stage.name), group_name=pipeline.name, kinds={"pytorch"}, pool=TRAINING_POOL,
           ins={"adapter": AssetIn(key=key(pipeline, stage.upstream[0]))},
           description="The adapter chain folded into the base model: a standalone model directory that "
                       "plain transformers loads.")
    def _merge(context, config: MergeConfig, store: ArtifactStore, training: TrainingResource,
               adapter: str) -> Output[str]:
        adapter_manifest = read_manifest(adapter)
        job = {"kind": "merge", "model": adapter_manifest["resolved_model"], "adapters": adapter_manifest["chain"]}
        if config.sample_prompt or stage.settings.get("sample_prompt"):
            job["sample_prompt"] = config.sample_prompt or stage.settings["sample_prompt"]
        with store.new_artifact(pipeline.name, stage.name, context.run_id) as (tmp, final):
            job["output_dir"] = str(tmp)
            info = training.run_job(context, job, tmp)
            info["model_dir"] = str(final / "model")
            write_manifest(tmp, kind="merged_model", base_model=adapter_manifest["base_model"],
                           resolved_model=adapter_manifest["resolved_model"], adapters=adapter_manifest["chain"],
                           upstream_mlflow_run_id=adapter_manifest.get("mlflow_run_id"), info=info,
                           dagster_run_id=context.run_id)
        return Output(str(final), metadata={
            "artifact_dir": MetadataValue.path(str(final)), "model_dir": MetadataValue.path(info["model_dir"]),
            "size_mb": info["size_mb"], "parameters": info["parameters"],
            "sample": MetadataValue.md(f"**{info['sample_prompt']}**\n\n{info['sample_reply']}")})
    return _merge

def evaluate_asset(pipeline: Pipeline, stage: Stage):
    from .report_stage import run_report_stage

    @asset(key=key(pipeline, stage.name), group_name=pipeline.name, kinds={"mlflow"}, pool=TRAINING_POOL,
           ins={"merged": AssetIn(key=key(pipeline, stage.upstream[0])),
                "dataset": AssetIn(key=key(pipeline, stage.upstream[1]))},
           description="Base model against the merged model on the same held-out rows: loss, perplexity, "
                       "task metrics and sample replies side by side.")
    def _evaluate(context, config: EvaluateConfig, store: ArtifactStore, tracking: MLflowTracking,
                  training: TrainingResource, merged: str, dataset: str) -> Output[str]:
        settings = {"n_samples": config.n_samples or stage.settings.get("n_samples", 5),
                    "max_eval_rows": config.max_eval_rows or stage.settings.get("max_eval_rows", 50),
                    "max_new_tokens": config.max_new_tokens or stage.settings.get("max_new_tokens", 128),
                    "n_judge": config.n_judge if config.n_judge is not None else stage.settings.get("n_judge", 5),
                    "judge": stage.settings.get("judge")}
        return run_report_stage(context, pipeline, stage, settings, merged, dataset, store, tracking, training)
    return _evaluate

def chat_tokens(tokenizer, row: dict) -> int:
    reply = row.get("completion") or row.get("chosen") or []  # a bare prompt row has no reply
    text = tokenizer.apply_chat_template(row["prompt"] + reply, tokenize=False, add_generation_prompt=not reply)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])

BUILDERS = {"chat_dataset": dataset_asset, "pairs_dataset": dataset_asset, "prompt_dataset": dataset_asset,
            "sft": training_asset, "preference": training_asset, "grpo": training_asset,
            "preference_pairs": synthesis_asset, "synthetic_dataset": synthesis_asset,
            "merge": merge_asset, "evaluate": evaluate_asset}

def build_pipeline_defs(pipeline: Pipeline) -> dict:
    """Assets, asset checks and a job for one pipeline."""
    assets = [source_asset(pipeline, name, spec) for name, spec in pipeline.datasets.items()]
    assets += [BUILDERS[stage.kind](pipeline, stage) for stage in pipeline.stages]
    names = [*pipeline.datasets, *(s.name for s in pipeline.stages)]
    job = define_asset_job(f"{pipeline.name}_pipeline", selection=AssetSelection.assets(
        *[key(pipeline, n) for n in names]),
        description=pipeline.description or f"Every stage of the {pipeline.name} pipeline.")
    parts = {"assets": assets, "asset_checks": build_checks(pipeline), "jobs": [job], "sensors": [], "schedules": []}
    if pipeline.feedback is not None:
        from .feedback import build_feedback_defs

        for name, values in build_feedback_defs(pipeline, merge_asset, evaluate_asset).items():
            parts[name] += values
    return parts
