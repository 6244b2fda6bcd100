"""sft: supervised fine-tuning of a LoRA adapter on chat rows (TRL's SFTTrainer)."""

from ...config.job import TrainingInputs
from ...config.kind import StageKind
from ...train.stage import adapter_checks
from .result import SFTResult
from .settings import SFT

KIND = StageKind(
    SFT,
    "training",
    TrainingInputs,
    SFTResult,
    f"{__name__}.worker:train_sft",
    adapter_checks,
    trl_config=f"{__name__}.trl_config:to_trl_config",
    summary="Supervised fine-tuning on chat rows (TRL SFTTrainer).",
)
