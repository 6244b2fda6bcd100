"""merge: the adapter chain before it folded into the base model, a standalone model plain transformers loads."""

from ...artifacts.manifest import MergeResult
from ...config.job import ModelInputs
from ...config.kind import StageKind
from .settings import Merge

KIND = StageKind(
    Merge,
    "merge",
    ModelInputs,
    MergeResult,
    f"{__name__}.worker:merge_chain",
    summary="The adapter chain folded into the base model.",
)
