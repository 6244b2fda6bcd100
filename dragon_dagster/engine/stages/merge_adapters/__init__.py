"""merge_adapters: adapters trained on the same base combined into one adapter (PEFT's add_weighted_adapter)."""

from ...config.kind import StageKind
from .inputs import CombineInputs
from .result import MergeAdaptersResult
from .settings import MergeAdapters

KIND = StageKind(
    MergeAdapters,
    "merge_adapters",
    CombineInputs,
    MergeAdaptersResult,
    f"{__name__}.worker:merge_adapter_set",
    summary="Adapters trained on the same base combined into one adapter (PEFT add_weighted_adapter: linear, "
    "svd, cat, TIES, DARE, magnitude pruning).",
)
