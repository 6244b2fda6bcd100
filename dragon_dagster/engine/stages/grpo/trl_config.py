"""The grpo kind's settings as TRL's GRPOConfig: its loss variants (variants.py) are TRL's arguments of the same
name; what every reinforcement kind maps is train/reinforce/settings.py's REINFORCE_NAMES."""

from __future__ import annotations

from typing import Any

from ...train.reinforce.settings import reinforce_config
from ...train.trl_config import TrainerRun
from .settings import GRPO


def to_trl_config(settings: GRPO, run: TrainerRun, **given: Any):
    """given: what the worker sets from the rewards and the tools (reward_weights, max_tool_calling_iterations)."""
    from trl import GRPOConfig

    return reinforce_config(GRPOConfig, settings, run, **given)
