"""The export kind's worker: release/export's export_model into the artifact's gguf/ directory."""

from __future__ import annotations

from pathlib import Path

from ...config.job import Job
from ...config.reporter import Reporter
from ...release.export.model import EXPORT_SUBDIR, export_model
from ...tools.declare import Toolset
from .inputs import ExportInputs
from .result import ExportResult
from .settings import Export

ExportJob = Job[Export, ExportInputs]


def tool_descriptions(toolset: Toolset | None) -> list[dict]:
    """The card's tools: each one's name and description, from the schemas the model was shown."""
    if toolset is None:
        return []
    return [
        {"name": s["function"]["name"], "description": s["function"].get("description") or ""} for s in toolset.schemas
    ]


def export_stage(job: ExportJob, reporter: Reporter) -> ExportResult:
    inputs = job.inputs
    reporter.log(f"exporting {inputs.model} to GGUF ({', '.join(job.settings.formats)})")
    info = export_model(
        inputs.model,
        Path(job.output_dir) / EXPORT_SUBDIR,
        formats=job.settings.formats,
        system=inputs.system,
        name=inputs.name,
        ollama_files=job.settings.ollama,
        evaluation=inputs.evaluation,
        reporter=reporter,
        tools=tool_descriptions(Toolset.from_input(inputs.tools)),
    )
    reporter.log(f"exported in {info['seconds']} s")
    return ExportResult.model_validate(info)
