"""rloo: REINFORCE leave-one-out (TRL's RLOOTrainer) on the same rewards, guard and checks as grpo, continuing
from the stage before it."""

from ...config.job import TrainingInputs
from ...config.kind import StageKind
from ...train.reinforce.checks import reinforce_checks
from ...train.reinforce.result import ReinforceResult
from .settings import RLOO

KIND = StageKind(
    RLOO,
    "training",
    TrainingInputs,
    ReinforceResult,
    f"{__name__}.worker:train_rloo",
    reinforce_checks,
    trl_config=f"{__name__}.trl_config:to_trl_config",
    summary="REINFORCE leave-one-out on verifiable or learned rewards (TRL RLOOTrainer).",
)
