"""grpo: reinforcement learning with verifiable rewards (TRL's GRPOTrainer), continuing from the stage before it."""

from ...config.job import TrainingInputs
from ...config.kind import StageKind
from ...train.reinforce.checks import reinforce_checks
from .result import GRPOResult
from .settings import GRPO

KIND = StageKind(
    GRPO,
    "training",
    TrainingInputs,
    GRPOResult,
    f"{__name__}.worker:train_grpo",
    reinforce_checks,
    trl_config=f"{__name__}.trl_config:to_trl_config",
    summary="Reinforcement learning with verifiable rewards (TRL GRPOTrainer).",
)
