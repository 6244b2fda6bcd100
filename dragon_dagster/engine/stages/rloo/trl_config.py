"""The rloo kind's settings as TRL's RLOOConfig: its own fields are TRL's arguments of the same name; what every
reinforcement kind maps is train/reinforce/settings.py's REINFORCE_NAMES."""

from __future__ import annotations

from typing import Any

from ...train.reinforce.settings import reinforce_config
from ...train.trl_config import TrainerRun
from .settings import RLOO


def to_trl_config(settings: RLOO, run: TrainerRun, **given: Any):
    """given: what the worker sets from the rewards and the tools (reward_weights, max_tool_calling_iterations)."""
    from trl import RLOOConfig

    return reinforce_config(RLOOConfig, settings, run, **given)
