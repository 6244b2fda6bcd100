"""The grpo kind's worker: TRL's GRPOTrainer in the run every reinforcement kind shares
(train/reinforce/worker.py), its GRPOConfig built from the stage's settings (trl_config.py): the loss variants
and tools.

Each prompt is answered group_size times; a completion's advantage is its reward against its group's
mean (scaled as scale_rewards says), so a group whose completions all score the same teaches nothing (the reason
the bundled arithmetic prompts sit where the model is right about half the time).
"""

from __future__ import annotations

from ...config.reporter import Reporter
from ...train.reinforce.worker import train_reinforce
from ...train.trainer import TrainingJob
from .result import GRPOResult
from .trl_config import to_trl_config


def train_grpo(job: TrainingJob, reporter: Reporter) -> GRPOResult | None:
    from trl import GRPOTrainer

    return train_reinforce(job, reporter, GRPOTrainer, to_trl_config, GRPOResult)
