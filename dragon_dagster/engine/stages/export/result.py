"""What an export stage reports: the GGUF files (size, digest), the Modelfile and the stop tokens."""

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
    card: str
    seconds: float
