"""The distill kind's settings as TRL's DistillationConfig: beta and temperature are TRL's (train/trl_config.py)."""

from __future__ import annotations

from ...train.trl_config import TrainerRun, trl_config
from .settings import Distill

NAMES = {"max_new_tokens": "max_completion_length"}  # the student's samples are as long as its replies


def to_trl_config(settings: Distill, run: TrainerRun):
    from trl import DistillationConfig

    return trl_config(DistillationConfig, settings, run, NAMES, log_completions=False)
