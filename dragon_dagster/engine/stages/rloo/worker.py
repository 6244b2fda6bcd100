"""The rloo kind's worker: TRL's RLOOTrainer in the run every reinforcement kind shares
(train/reinforce/worker.py), its RLOOConfig built from the stage's settings (trl_config.py): the same rewards,
guard, held-out scoring before and after, and fast paths."""

from __future__ import annotations

from ...config.reporter import Reporter
from ...train.reinforce.result import ReinforceResult
from ...train.reinforce.worker import train_reinforce
from ...train.trainer import TrainingJob
from .trl_config import to_trl_config


def train_rloo(job: TrainingJob, reporter: Reporter) -> ReinforceResult | None:
    from trl import RLOOTrainer

    return train_reinforce(job, reporter, RLOOTrainer, to_trl_config, ReinforceResult)
