"""The grpo kind's TRL trainer: GRPOTrainer with this project's speed paths (train/reinforce/trainer.py)."""

from __future__ import annotations


def grpo_trainer():
    from trl import GRPOTrainer

    from ...train.reinforce.trainer import fast_trainer

    return fast_trainer(GRPOTrainer)
