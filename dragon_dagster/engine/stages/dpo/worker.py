"""The dpo kind's worker: TRL's DPOConfig and DPOTrainer, the fused head swapped for the chunked one on a CPU."""

from __future__ import annotations

from ...config.reporter import Reporter
from ...train.preference import PreferenceMethod, PreferenceResult, train_preference, trainer_parts
from ...train.preference_head import use_chunked_head
from ...train.trainer import TrainingJob
from ...train.trl_config import TrainerRun
from .result import DPOResult
from .trl_config import to_trl_config


class DPOMethod(PreferenceMethod):
    result = DPOResult

    def trainer(self, job: TrainingJob, p, run: TrainerRun, callback, chunked: bool):
        from trl import DPOTrainer

        config = to_trl_config(job.settings, run)
        return DPOTrainer(model=p.model, ref_model=None, args=config, **trainer_parts(p, callback))

    def use_head(self, trainer, speed: dict) -> None:
        # a batch is [chosen; rejected]: with unpad, a pair's common prompt runs once for both replies
        use_chunked_head(
            trainer.model.get_base_model(), speed["unpad"], getattr(trainer, "use_weighting", False), paired=True
        )

    def train_figures(self, job, p) -> dict:
        return {"eval_pairs": len(p.eval_rows)}


def train_dpo(job: TrainingJob, reporter: Reporter) -> PreferenceResult | None:
    return train_preference(job, reporter, DPOMethod())
