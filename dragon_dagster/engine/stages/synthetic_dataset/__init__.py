"""synthetic_dataset: SFT rows written by a teacher model, with a quality pass."""

from ...artifacts.manifest import DataResult
from ...config.job import SynthesisInputs
from ...config.kind import StageKind
from ...data.checks import quality_check
from .settings import SyntheticDataset

KIND = StageKind(
    SyntheticDataset,
    "synthesis",
    SynthesisInputs,
    DataResult,
    f"{__name__}.worker:synthesize_sft",
    lambda stage: [quality_check()],
    summary="Teacher-written SFT rows with a quality pass.",
)
