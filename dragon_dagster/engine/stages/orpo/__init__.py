"""orpo: Odds Ratio Preference Optimization on pairs, continuing from the stage before it."""

from ...config.job import TrainingInputs
from ...config.kind import StageKind
from ...train.stage import adapter_checks
from .result import ORPOResult
from .settings import ORPO

KIND = StageKind(
    ORPO,
    "training",
    TrainingInputs,
    ORPOResult,
    f"{__name__}.worker:train_orpo",
    adapter_checks,
    trl_config=f"{__name__}.trl_config:to_trl_config",
    summary="Odds Ratio Preference Optimization on pairs (TRL ORPOTrainer).",
)
