"""The export asset's work: run the GGUF export job on the merged model, with the evaluation table for the card
when the pipeline evaluates that model and the pipeline's tools (the card lists them), and describe the files in
the asset's metadata."""

from __future__ import annotations

from pathlib import Path

from dagster import MetadataValue, Output

from ..engine import catalog
from ..engine.artifacts.manifest import ExportManifest, MergedManifest, read_manifest, write_manifest
from ..engine.pipeline import Pipeline
from ..engine.release.export.model import EXPORT_SUBDIR
from ..engine.release.export.ollama import create_command
from ..engine.stages.evaluate.checks import read_report
from ..engine.stages.export.inputs import ExportInputs
from ..engine.stages.export.settings import Export
from .metadata import md_table
from .prompts import live_system


def default_system(pipeline: Pipeline, stage: Export, tracking) -> tuple[str | None, str | None]:
    """(system prompt, its prompts:/ URI): the stage's own (unregistered), else the live version of the
    pipeline's system prompt in the Prompt Registry, else the fixed system prompt of the chat dataset the exported
    merge's first training stage trained on (what the model learned to answer after), else none."""
    if stage.system:
        return stage.system, None
    return live_system(pipeline, tracking, pipeline.system_prompt(before=pipeline.upstream(stage.name)[0]))


def run_export_stage(
    context, pipeline: Pipeline, stage: Export, merged: str, report: str | None, store, training, tracking
) -> Output[str]:
    """stage: the effective settings. merged, report: local artifact directories (report: None without one)."""
    evaluation = read_report(report).card_table() if report and (Path(report) / "report.json").exists() else None
    system, prompt_uri = default_system(pipeline, stage, tracking)
    with store.new_artifact(pipeline.name, stage.name, context.op_execution_context.run_id) as (tmp, final):
        job = catalog.kind_of(stage).job_model()(
            settings=stage,
            inputs=ExportInputs(
                model=merged,
                system=system,
                name=stage.model_name or pipeline.name,
                evaluation=evaluation,
                tools=pipeline.tools.to_input(tmp / "tools") if pipeline.tools else None,
            ),
            output_dir=str(tmp),
        )
        info = training.run_job(context, job, tmp, store=store, final=final)
        export_dir = final / EXPORT_SUBDIR  # the worker wrote into the staging dir, renamed to final on success
        files = [f.model_copy(update={"path": str(export_dir / f.file)}) for f in info.files]
        # made here: the worker saw the staging directory (or, on another node, a local copy of it)
        command = create_command(export_dir, info.name) if info.modelfile else None
        write_manifest(
            tmp,
            ExportManifest(
                merged=merged,
                report=report,
                settings=stage,
                name=info.name,
                architecture=info.architecture,
                files=files,
                system=system,
                system_prompt_uri=prompt_uri,
                stop=info.stop,
                ollama_create=command,
                seconds=info.seconds,
                merged_mlflow_run_id=read_manifest(merged, MergedManifest).upstream_mlflow_run_id,
                dagster_run_id=context.op_execution_context.run_id,
            ),
        )
    metadata = {
        "artifact_dir": MetadataValue.path(str(final)),
        "export_dir": MetadataValue.path(str(export_dir)),
        "files": md_table(
            [
                {
                    **f.model_dump(include={"file", "format", "size_mb", "sha256"}),
                    "identical_replies": f"{f.agreement.identical_replies}/{f.agreement.prompts}"
                    if f.agreement
                    else "-",
                    "token_agreement": f.agreement.token_agreement if f.agreement else "-",
                }
                for f in files
            ],
            ["file", "format", "size_mb", "identical_replies", "token_agreement", "sha256"],
        ),
        **{f"{f.format}_path": MetadataValue.path(f.path) for f in files},
        **{f"{f.format}_size_mb": f.size_mb for f in files},
        **{f"{f.format}_sha256": MetadataValue.text(f.sha256) for f in files},
        # each file loaded back against the merged model (release/export/verify.py); the check judges them
        **{f"{f.format}_token_agreement": f.agreement.token_agreement for f in files if f.agreement},
        **{f"{f.format}_reply_agreement": f.agreement.reply_agreement for f in files if f.agreement},
        "model_card": MetadataValue.path(str(export_dir / "README.md")),
        "export_seconds": info.seconds,
        "architecture": info.architecture,
        "system_prompt": MetadataValue.text(system or "(none)"),
        "system_prompt_version": MetadataValue.text(prompt_uri or "(not registered)"),
    }
    if info.tools:  # the card lists them; the Modelfile renders them when the chat template allows
        metadata["tools"] = MetadataValue.text(", ".join(t["name"] for t in info.tools))
        metadata["modelfile_tools"] = MetadataValue.text(
            "rendered" if info.modelfile_tools else f"not rendered: {info.modelfile_tools_note or 'no Modelfile'}"
        )
    if command:
        metadata.update(
            {
                "modelfile": MetadataValue.path(str(export_dir / "Modelfile")),
                "ollama_create": MetadataValue.text(command),
                "stop_tokens": MetadataValue.text(", ".join(info.stop)),
            }
        )
    return Output(str(final), metadata=metadata)
