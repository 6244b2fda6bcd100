"""The kto kind's worker: TRL's KTOConfig and KTOTrainer on rated replies (with the chunked head, the subclass
that runs each prompt fewer times: trainer.py), loss weights balanced by default, and the per-reply accuracy TRL's
KTO does not log."""

from __future__ import annotations

from ...config.reporter import Reporter
from ...data.row_mapping import unpaired
from ...infer.logprobs import reply_logprobs
from ...train import distributed
from ...train.preference import PreferenceMethod, PreferenceResult, train_preference, trainer_parts
from ...train.preference_head import use_chunked_head
from ...train.trainer import TrainingError, TrainingJob
from ...train.trl_config import TrainerRun
from .result import KTOResult
from .trainer import shared_prompt_trainer
from .trl_config import kto_weights, to_trl_config


class KTOMethod(PreferenceMethod):
    result = KTOResult
    held_out = "rated replies"

    def trainer(self, job: TrainingJob, p, run: TrainerRun, callback, chunked: bool):
        from datasets import Dataset
        from trl import KTOTrainer

        per_device = distributed.split_batch(job.settings.args.batch_size, run.workers)
        if per_device < 2:
            raise TrainingError(
                f"kto needs at least 2 rows per device step (it estimates its KL term from the other replies in a "
                f"batch); this run has {per_device}: raise args.batch_size"
            )
        # shuffled: KTO reads batches in order (its KL term pairs each reply with another prompt of the same batch),
        # and rated files, unpaired pairs and feedback come grouped by label or prompt
        train = Dataset.from_list(unpaired(p.trained_rows)).shuffle(seed=p.args.seed)
        evals = Dataset.from_list(unpaired(p.eval_rows)) if p.eval_rows else None
        # the classes' weights balance the split, not the sample of it that max_steps reaches (a few rows' draw)
        config = to_trl_config(job.settings, run, labels=[bool(r["label"]) for r in unpaired(p.train_rows)])
        parts = trainer_parts(p, callback, train, evals)
        trainer_class = shared_prompt_trainer() if chunked else KTOTrainer
        return trainer_class(model=p.model, ref_model=None, args=config, **parts)

    def use_head(self, trainer, speed: dict) -> None:
        # paired: rated replies unpaired from preference pairs share their prompt, which then runs once
        base = trainer.model.get_base_model()
        use_chunked_head(base, speed["unpad"], getattr(trainer, "use_weighting", False), paired=speed["unpad"])
        trainer.shares_prompts = speed["unpad"]

    def train_figures(self, job: TrainingJob, p) -> dict:
        labels = [bool(r["label"]) for r in unpaired(p.train_rows)]
        return {
            "eval_rows": len(p.eval_rows),
            "train_liked": sum(labels),
            "train_disliked": len(labels) - sum(labels),
            **kto_weights(job.settings, labels),
        }

    def eval_figures(self, job: TrainingJob, p, trainer, figures: dict) -> dict:
        if not distributed.is_main():
            return {}
        trainer.model.eval()  # TRL's KTO logs no accuracy: per reply, as DPO's pairs have it
        accuracy = kto_accuracy(trainer.model, p.tokenizer, p.eval_rows, job.settings.beta, p.args.max_seq_len)
        return {**accuracy, "kl": figures.get("eval_kl")}


def train_kto(job: TrainingJob, reporter: Reporter) -> PreferenceResult | None:
    return train_preference(job, reporter, KTOMethod())


def mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def kto_accuracy(model, tokenizer, rows: list[dict], beta: float, max_len: int) -> dict:
    """On held-out rated replies: the implicit reward beta * (log p_adapter - log p_start) of each reply, and
    the share the adapter moved the right way (a liked reply likelier than before, a disliked one less)."""
    rows = unpaired(rows)
    trained = reply_logprobs(model, tokenizer, rows, max_len)
    with model.disable_adapter():  # the reference: the model the stage started from
        start = reply_logprobs(model, tokenizer, rows, max_len)
    rewards = [beta * (a - b) for (a, _), (b, _) in zip(trained, start)]
    liked = [r for r, row in zip(rewards, rows) if row["label"]]
    disliked = [r for r, row in zip(rewards, rows) if not row["label"]]
    right = sum(r > 0 for r in liked) + sum(r < 0 for r in disliked)
    margin = mean(liked) - mean(disliked) if liked and disliked else None
    return {
        "pref_accuracy": right / len(rows),
        "reward_margin": margin,
        "reward_liked": mean(liked),
        "reward_disliked": mean(disliked),
        "eval_liked": len(liked),
        "eval_disliked": len(disliked),
    }
