"""dpo: Direct Preference Optimization on pairs, continuing from the stage before it."""

from ...config.job import TrainingInputs
from ...config.kind import StageKind
from ...train.stage import adapter_checks
from .result import DPOResult
from .settings import DPO

KIND = StageKind(
    DPO,
    "training",
    TrainingInputs,
    DPOResult,
    f"{__name__}.worker:train_dpo",
    adapter_checks,
    trl_config=f"{__name__}.trl_config:to_trl_config",
    summary="Direct Preference Optimization on pairs (TRL DPOTrainer).",
)
