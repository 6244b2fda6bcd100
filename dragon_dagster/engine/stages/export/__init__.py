"""export: the merged model as GGUF files (llama.cpp, Ollama) with a Modelfile and a model card."""

from ...config.kind import StageKind
from .checks import export_checks
from .inputs import ExportInputs
from .result import ExportResult
from .settings import Export

KIND = StageKind(
    Export,
    "export",
    ExportInputs,
    ExportResult,
    f"{__name__}.worker:export_stage",
    export_checks,
    summary="The merged model as GGUF files with an Ollama Modelfile and a model card.",
)
