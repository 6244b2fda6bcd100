"""kto: Kahneman-Tversky Optimization on rated replies, continuing from the stage before it."""

from ...config.job import TrainingInputs
from ...config.kind import StageKind
from ...train.stage import adapter_checks
from .result import KTOResult
from .settings import KTO

KIND = StageKind(
    KTO,
    "training",
    TrainingInputs,
    KTOResult,
    f"{__name__}.worker:train_kto",
    adapter_checks,
    trl_config=f"{__name__}.trl_config:to_trl_config",
    summary="Kahneman-Tversky Optimization on liked or disliked replies (TRL KTOTrainer).",
)
