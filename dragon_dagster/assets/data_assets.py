"""The assets that make data: a source file's snapshot, a dataset stage's rows (mapped, held out, checked,
measured in the model's tokens) and a synthesis stage's rows made by models in a worker."""

import shutil
from pathlib import Path

from dagster import MetadataValue, Output, asset

from ..engine import catalog, models
from ..engine.artifacts.directories import sha256
from ..engine.artifacts.manifest import (
    AdapterManifest,
    DatasetManifest,
    MixShare,
    NearDuplicateReport,
    SourceManifest,
    SynthesisManifest,
    read_manifest,
    write_manifest,
)
from ..engine.config.job import SynthesisInputs
from ..engine.config.stage import Stage
from ..engine.data import row_parts, tables
from ..engine.data.lengths import chat_token_lengths
from ..engine.data.prepare import prepare
from ..engine.data.stage import DatasetStage
from ..engine.pipeline import Pipeline
from ..engine.pipeline.versions import file_version, stage_version
from ..resources import ArtifactStore, MLflowTracking, TrainingResource
from .asset_wiring import ins_for, key, local_inputs, named_failure, training_group
from .launchpad import effective, launchpad_config
from .metadata import as_metadata, length_stats, log_pii, md_table, pii_metadata
from .pool import POOL_TAGS, TRAINING_POOL
from .prompts import register_dataset_prompt
from .reuse import reuse_or_make


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


def source_inputs(stage: DatasetStage) -> list[str]:
    """The asset's parameters for the `datasets:` sources it reads, in the order of stage.reads(): `source`
    for its one source, `source_1`, `source_2`, ... for a mixture's (a dataset's name need not be an
    identifier)."""
    if not stage.sources:
        return ["source"]
    return [f"source_{i}" for i in range(1, len(stage.reads()) + 1)]


def read_mixture(pipeline: Pipeline, stage: DatasetStage, inputs: dict) -> tuple[dict, dict[str, str]]:
    """A mixture's tables by source label, and where each was read from (its snapshot, or its file)."""
    snapshots = dict(zip(stage.reads(), (inputs[name] for name in source_inputs(stage)), strict=True))
    frames, where = {}, {}
    for origin in stage.sources:
        if origin.source:
            snapshot = snapshots[origin.source]
            file = Path(snapshot) / read_manifest(snapshot, SourceManifest).file
            fmt = origin.format or stage.format or pipeline.datasets[origin.source].format
            frames[origin.label], where[origin.label] = tables.read_table(file, fmt), snapshot
        else:
            frames[origin.label] = tables.read_table(origin.path, origin.format or stage.format)
            where[origin.label] = origin.path
    return frames, where


def dataset_asset(pipeline: Pipeline, stage: DatasetStage):
    mapped = ", ".join(f"{k} {v!r}" for k, v in stage.mapped_columns().items() if k != "system")
    origin = stage.source or stage.path
    if stage.sources:
        origin = "a mixture of " + ", ".join(f"{s.label} (weight {s.weight:g})" for s in stage.sources)

    @asset(
        key=key(pipeline, stage.name),
        group_name=training_group(pipeline),
        kinds={"dataset"},
        ins=ins_for(pipeline, stage, *source_inputs(stage)),
        description=f"{stage.kind.replace('_', ' ').capitalize()} mapped from {origin} "
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
            if settings.sources:
                df, where = read_mixture(pipeline, settings, inputs)
            else:
                df, where = read_source(pipeline, settings, inputs.get("source")), {}
            prepared = prepare(settings, df)
            tokenizer = models.load_tokenizer(models.check_loadable(pipeline.model))
        train, held, dropped, duplicates = prepared.train, prepared.held, prepared.dropped, prepared.duplicates
        leakage, quality, near = prepared.leakage, prepared.quality, prepared.near_duplicates
        log_pii(context, stage.name, prepared.pii)
        lengths = chat_token_lengths(tokenizer, prepared.rows)
        prompt_uri = register_dataset_prompt(pipeline, stage.name, getattr(settings, "system", None), tracking)
        with store.new_artifact(pipeline.name, stage.name, context.op_execution_context.run_id) as (tmp, final):
            tables.write_jsonl(tmp / "train.jsonl", train)
            tables.write_jsonl(tmp / "eval.jsonl", held)
            # keep each file it read directly (not a source asset's snapshot), so the artifact reproduces itself
            for i, file in enumerate(o.path for o in settings.origins() if o.path):
                copy = shutil.copytree if Path(file).is_dir() else shutil.copyfile
                copy(file, tmp / f"source{'' if settings.path else f'_{i + 1}'}{Path(file).suffix}")
            write_manifest(
                tmp,
                DatasetManifest(
                    kind=stage.kind,
                    source=inputs.get("source") or settings.path or origin,
                    settings=settings,
                    train_rows=len(train),
                    eval_rows=len(held),
                    dropped=dropped,
                    quality=quality,
                    duplicates_dropped=duplicates,
                    **leakage,
                    group_by=settings.group_by or "the user prompt",
                    system_prompt_uri=prompt_uri,
                    mixture=[MixShare(**share, read_from=where[share["source"]]) for share in prepared.mixture],
                    near_duplicates=NearDuplicateReport(**near) if near else None,
                    pii=prepared.pii,
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
                **({"mixture": md_table(prepared.mixture)} if prepared.mixture else {}),
                **(near_duplicate_metadata(near) if near else {}),
                **{f"share_{m['source']}": m["share"] for m in prepared.mixture},  # plotted run over run
                **pii_metadata(prepared.pii),
            },
        )

    return _dataset


def near_duplicate_metadata(near: dict) -> dict:
    """The near-duplicate search on the asset page: its counts plotted run over run, a few clusters' prompts."""
    return {
        "near_duplicate_clusters": near["clusters"],
        "near_duplicate_rows": near["rows_in_clusters"],
        "near_duplicates_dropped": near["dropped"],
        "near_duplicate_seconds": near["seconds"],
        "near_duplicate_examples": md_table(
            [{"cluster": k + 1, "prompt": text} for k, texts in enumerate(near["examples"]) for text in texts]
        ),
    }


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
            held_out_file=str(Path(inputs["dataset"]) / "eval.jsonl"),
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
