"""The rloo kind's worker: TRL's RLOOTrainer and RLOOConfig in the run every reinforcement kind shares
(train/reinforce/worker.py): the same rewards, guard, held-out scoring before and after, and fast paths."""

from __future__ import annotations

from ...config.reporter import Reporter
from ...train.reinforce.result import ReinforceResult
from ...train.reinforce.worker import train_reinforce
from ...train.trainer import TrainingJob


def train_rloo(job: TrainingJob, reporter: Reporter) -> ReinforceResult | None:
    from trl import RLOOConfig, RLOOTrainer

    return train_reinforce(job, reporter, RLOOTrainer, RLOOConfig, ReinforceResult)
