"""The sft kind's settings: supervised fine-tuning on chat rows."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ...config.stage import METRICS_DOC, MetricNames
from ...train.stage import TrainerStage


class SFT(TrainerStage):
    """Supervised fine-tuning with TRL's SFTTrainer; loss on the final assistant turn only."""

    kind: Literal["sft"]
    metrics: MetricNames = Field(None, description=METRICS_DOC)
