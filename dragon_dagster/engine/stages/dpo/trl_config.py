"""The dpo kind's settings as TRL's DPOConfig: its loss fields (loss_type, loss_weights, label_smoothing,
discopop_tau) and beta are TRL's arguments of the same name (train/trl_config.py)."""

from __future__ import annotations

from ...train.preference import preference_config
from ...train.trl_config import TrainerRun
from .settings import DPO


def to_trl_config(settings: DPO, run: TrainerRun):
    from trl import DPOConfig

    return preference_config(DPOConfig, settings, run)
