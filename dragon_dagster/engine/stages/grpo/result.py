"""What a grpo stage reports: what every reinforcement stage does (train/reinforce/result.py)."""

from __future__ import annotations

from ...train.reinforce.result import ReinforceResult


class GRPOResult(ReinforceResult):
    """A grpo stage's figures: each reward before and after on the held-out prompts, KL, cut-off completions."""
