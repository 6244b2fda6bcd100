"""reward_model: a learned reward, a LoRA sequence-classification head on the base model trained on preference pairs
(TRL's RewardTrainer). It scores any reply; a GRPO stage optimizes against it with a `reward_model` reward."""

from ...config.job import TrainingInputs
from ...config.kind import StageKind
from .checks import reward_model_checks
from .result import RewardModelResult
from .settings import RewardModel

KIND = StageKind(
    RewardModel,
    "training",
    TrainingInputs,
    RewardModelResult,
    f"{__name__}.worker:train_reward_model",
    reward_model_checks,
    trl_config=f"{__name__}.trl_config:to_trl_config",
    summary="A learned reward: a scalar head trained on preference pairs (TRL RewardTrainer).",
)
