"""What the export kind's worker reads: the merged model, and what the Dagster step worked out for the card and
the Modelfile (the system prompt, the evaluation table, the pipeline's tools)."""

from __future__ import annotations

from ...config.job import Contract, JobPath, ToolsInput


class ExportInputs(Contract):
    model: JobPath  # the merged-model artifact directory
    system: str | None = None  # the Modelfile's system prompt
    name: str | None = None  # the model's name in the files and for `ollama create`
    evaluation: str | None = None  # the evaluation report's table for the card (Markdown)
    tools: ToolsInput | None = None  # the pipeline's tools, which the model trained with: the card lists them
