"""What an export stage reports: the GGUF files (size, digest), the Modelfile (stop tokens, tool support) and the
tools the card lists."""

from __future__ import annotations

from pydantic import Field

from ...artifacts.manifest import ExportedFile
from ...config.results import StageResult


class ExportResult(StageResult):
    export_dir: str
    name: str
    architecture: str
    files: list[ExportedFile]
    modelfile: str | None = None
    ollama_create: str | None = None
    stop: list[str] = Field(default_factory=list)
    system: str | None = None
    tools: list[dict] = Field(default_factory=list)  # the tools the card lists: [{"name", "description"}]
    modelfile_tools: bool = False  # whether the Modelfile's TEMPLATE renders tools
    modelfile_tools_note: str | None = None  # why it does not, when the model's chat template renders them not so
    card: str
    seconds: float
