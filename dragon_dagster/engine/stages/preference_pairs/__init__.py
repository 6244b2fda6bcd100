"""preference_pairs: pairs made from the latest adapter's own samples, against a teacher or judged."""

from ...artifacts.manifest import DataResult
from ...config.job import SynthesisInputs
from ...config.kind import StageKind
from ...data.checks import quality_check
from .settings import PreferencePairs

KIND = StageKind(
    PreferencePairs,
    "synthesis",
    SynthesisInputs,
    DataResult,
    f"{__name__}.worker:synthesize_pairs",
    lambda stage: [quality_check()],
    summary="Pairs from the latest adapter's own samples (teacher or judge).",
)
