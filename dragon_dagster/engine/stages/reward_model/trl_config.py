"""The reward_model kind's settings as TRL's RewardConfig (train/trl_config.py)."""

from __future__ import annotations

from ...train.trl_config import TrainerRun, trl_config
from .settings import RewardModel

NAMES = {"args.max_seq_len": "max_length", "center_rewards": "center_rewards_coefficient"}


def to_trl_config(settings: RewardModel, run: TrainerRun):
    from trl import RewardConfig

    # disable_dropout as the preference kinds: why lora.dropout above 0 is refused
    return trl_config(RewardConfig, settings, run, NAMES, disable_dropout=True)
