"""The orpo kind's worker: trl.experimental.orpo's ORPOConfig and ORPOTrainer; with the chunked head, the
subclass that scores a batch through it (train/preference_head.py)."""

from __future__ import annotations

from ...config.reporter import Reporter
from ...train.preference import PreferenceMethod, PreferenceResult, train_preference, trainer_parts
from ...train.preference_head import chunked_orpo_trainer
from ...train.trainer import TrainingJob
from ...train.trl_config import TrainerRun
from .result import ORPOResult
from .trl_config import to_trl_config


class ORPOMethod(PreferenceMethod):
    result = ORPOResult

    def trainer(self, job: TrainingJob, p, run: TrainerRun, callback, chunked: bool):
        from trl.experimental.orpo import ORPOTrainer

        trainer_class = chunked_orpo_trainer() if chunked else ORPOTrainer
        return trainer_class(model=p.model, args=to_trl_config(job.settings, run), **trainer_parts(p, callback))

    def use_head(self, trainer, speed: dict) -> None:
        trainer.unpad = speed["unpad"]

    def train_figures(self, job, p) -> dict:
        return {"eval_pairs": len(p.eval_rows)}


def train_orpo(job: TrainingJob, reporter: Reporter) -> PreferenceResult | None:
    return train_preference(job, reporter, ORPOMethod())
