"""The orpo kind's settings as trl.experimental.orpo's ORPOConfig (train/trl_config.py)."""

from __future__ import annotations

from ...train.preference import preference_config
from ...train.trl_config import TrainerRun
from .settings import ORPO


def to_trl_config(settings: ORPO, run: TrainerRun):
    from trl.experimental.orpo import ORPOConfig

    return preference_config(ORPOConfig, settings, run)
