"""distill: on-policy distillation (TRL's DistillationTrainer) of a teacher, an earlier stage or a model named by
where it is, into a LoRA student: the chain so far, or a fresh adapter on the pipeline's model."""

from ...config.job import TrainingInputs
from ...config.kind import StageKind
from .checks import distill_checks
from .result import DistillResult
from .settings import Distill

KIND = StageKind(
    Distill,
    "training",
    TrainingInputs,
    DistillResult,
    f"{__name__}.worker:train_distill",
    distill_checks,
    trl_config=f"{__name__}.trl_config:to_trl_config",
    summary="On-policy distillation from a teacher model into a LoRA student (TRL DistillationTrainer).",
)
