"""The export asset's work: run the GGUF export job on the merged model, with the evaluation table for the card
when the pipeline evaluates that model, and describe the files in the asset's metadata."""

from __future__ import annotations

import json
from pathlib import Path

from dagster import MetadataValue, Output

from ..engine.artifacts import read_manifest, write_manifest
from ..engine.export.card import evaluation_table
from ..engine.export.job import EXPORT_SUBDIR
from ..engine.export.ollama import create_command
from ..engine.spec import stages as st
from ..engine.spec.pipeline import Pipeline
from .metadata import md_table


def default_system(pipeline: Pipeline, stage: st.Export) -> str | None:
    """The stage's system prompt, else the fixed system prompt of the chat dataset the exported merge's first
    training stage trained on (what the model learned to answer after), else none."""
    return stage.system or pipeline.system_prompt(before=pipeline.upstream(stage.name)[0])


def run_export_stage(
    context, pipeline: Pipeline, stage: st.Export, merged: str, report: str | None, store, training
) -> Output[str]:
    """stage: the effective settings. merged, report: local artifact directories (report: None without one)."""
    report_json = Path(report) / "report.json" if report else None
    evaluation = evaluation_table(json.loads(report_json.read_text())) if report_json and report_json.exists() else None
    system = default_system(pipeline, stage)
    with store.new_artifact(pipeline.name, stage.name, context.run_id) as (tmp, final):
        job = {
            "settings": stage.model_dump(),
            "model": merged,
            "output_dir": str(tmp),
            "system": system,
            "name": stage.model_name or pipeline.name,
            "evaluation": evaluation,
        }
        info = training.run_job(context, job, tmp, store=store, final=final)
        export_dir = final / EXPORT_SUBDIR  # the worker wrote into the staging dir, renamed to final on success
        files = [{**f, "path": str(export_dir / f["file"])} for f in info["files"]]
        # made here: the worker saw the staging directory (or, on another node, a local copy of it)
        command = create_command(export_dir, info["name"]) if info["modelfile"] else None
        write_manifest(
            tmp,
            kind="gguf_export",
            merged=merged,
            report=report,
            settings=stage.model_dump(),
            name=info["name"],
            architecture=info["architecture"],
            files=files,
            system=system,
            stop=info["stop"],
            ollama_create=command,
            seconds=info["seconds"],
            merged_mlflow_run_id=read_manifest(merged).get("upstream_mlflow_run_id"),
            dagster_run_id=context.run_id,
        )
    metadata = {
        "artifact_dir": MetadataValue.path(str(final)),
        "export_dir": MetadataValue.path(str(export_dir)),
        "files": md_table([{k: f[k] for k in ("file", "format", "size_mb", "sha256")} for f in files]),
        **{f"{f['format']}_path": MetadataValue.path(f["path"]) for f in files},
        **{f"{f['format']}_size_mb": f["size_mb"] for f in files},
        **{f"{f['format']}_sha256": MetadataValue.text(f["sha256"]) for f in files},
        "model_card": MetadataValue.path(str(export_dir / "README.md")),
        "export_seconds": info["seconds"],
        "architecture": info["architecture"],
        "system_prompt": MetadataValue.text(system or "(none)"),
    }
    if command:
        metadata.update(
            {
                "modelfile": MetadataValue.path(str(export_dir / "Modelfile")),
                "ollama_create": MetadataValue.text(command),
                "stop_tokens": MetadataValue.text(", ".join(info["stop"])),
            }
        )
    return Output(str(final), metadata=metadata)
