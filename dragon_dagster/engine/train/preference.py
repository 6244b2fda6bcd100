"""Preference optimization on a LoRA adapter: DPO (TRL's DPOTrainer) or ORPO (trl.experimental.orpo) on pairs,
KTO (TRL's KTOTrainer) on single liked/disliked replies: the ratings people give without a matching opposite.

With PEFT, DPO and KTO need no separate reference model: the policy with its adapter switched off is the
reference, which is the model the stage started from (earlier adapters already folded in).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .. import distributed
from ..data.tables import unpaired
from ..evaluate.replies import generate, reply_logprobs
from ..reporter import Reporter
from ..spec.stages import Preference
from . import progress
from .preference_head import chunked_orpo_trainer, use_chunked_head
from .trainer import (
    StageJob,
    TrainingError,
    apply_speed,
    common_args,
    lora_config,
    prepare,
    progress_callback,
    run_trainer,
)


@dataclass
class PreferenceJob(StageJob):
    settings: Preference


def build_trainer(job: PreferenceJob, p, callback, chunked: bool = False):
    """The method's TRL trainer; with chunked, ORPO's is the subclass that scores through the chunked head (DPO's
    and KTO's fused head is swapped after construction, by use_chunked_head)."""
    from datasets import Dataset

    kwargs = dict(
        common_args(p.args, p.hardware, job.checkpoint_dir, p.speed, compiled_here=chunked, workers=p.workers),
        beta=job.settings.beta,
        max_length=p.args.max_seq_len,
    )
    train = Dataset.from_list(p.train_rows)
    evals = Dataset.from_list(p.eval_rows) if p.eval_rows else None
    check_rows(job.settings.method, p.train_rows, kwargs["per_device_train_batch_size"])
    if job.settings.method == "kto":
        from trl import KTOConfig, KTOTrainer

        # shuffled: KTO reads batches in order (its KL term pairs each reply with another prompt of the same batch),
        # and rated files, unpaired pairs and feedback come grouped by label or prompt
        train = Dataset.from_list(unpaired(p.train_rows)).shuffle(seed=p.args.seed)
        evals = Dataset.from_list(unpaired(p.eval_rows)) if p.eval_rows else None
        weights = kto_weights(job.settings, [bool(r["label"]) for r in train])
        return KTOTrainer(
            model=p.model,
            ref_model=None,
            args=KTOConfig(**kwargs, **weights),
            train_dataset=train,
            eval_dataset=evals,
            processing_class=p.tokenizer,
            peft_config=lora_config(p.lora),
            callbacks=[callback],
        )
    if job.settings.method == "orpo":
        from trl.experimental.orpo import ORPOConfig, ORPOTrainer

        return (chunked_orpo_trainer() if chunked else ORPOTrainer)(
            model=p.model,
            args=ORPOConfig(**kwargs),
            train_dataset=train,
            eval_dataset=evals,
            processing_class=p.tokenizer,
            peft_config=lora_config(p.lora),
            callbacks=[callback],
        )
    from trl import DPOConfig, DPOTrainer

    return DPOTrainer(
        model=p.model,
        ref_model=None,
        args=DPOConfig(**kwargs),
        train_dataset=train,
        eval_dataset=evals,
        processing_class=p.tokenizer,
        peft_config=lora_config(p.lora),
        callbacks=[callback],
    )


def check_rows(method: str, rows: list[dict], per_device_batch: int) -> None:
    """Refuse data the method cannot train on, naming what it needs (a run's settings can switch the method)."""
    if method == "kto":
        if not all("chosen" in r or "label" in r for r in rows):
            raise TrainingError(
                "kto trains on rated replies (a rated_dataset) or pairs; these rows have neither a "
                "label nor a chosen reply"
            )
        if per_device_batch < 2:
            raise TrainingError(
                f"kto needs at least 2 rows per device step (it estimates its KL term from the other "
                f"replies in a batch); this run has {per_device_batch}: raise args.batch_size"
            )
    elif not all("chosen" in r and "rejected" in r for r in rows):
        raise TrainingError(
            f"{method} trains on pairs (chosen and rejected replies); these rows are not pairs: use a "
            "pairs_dataset or preference_pairs, or method: kto for rated replies"
        )


def kto_weights(settings: Preference, labels: list[bool]) -> dict:
    """KTO's loss weights: the stage's, else balanced so that liked x weight ~ disliked x weight (the KTO paper
    asks for a ratio in [1, 4/3]); ratings are rarely balanced (people click thumbs up more often)."""
    liked, disliked = sum(labels), len(labels) - sum(labels)
    desirable = settings.desirable_weight or (min(1.0, disliked / liked) if liked and disliked else 1.0)
    undesirable = settings.undesirable_weight or (min(1.0, liked / disliked) if liked and disliked else 1.0)
    return {"desirable_weight": desirable, "undesirable_weight": undesirable}


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


def use_speed(trainer, p, chunked: bool, method: str, reporter: Reporter) -> dict:
    """The trainer's speed choices (trainer.apply_speed), and the chunked head where it scores."""
    speed = apply_speed(trainer, p.speed, chunked, reporter)
    if chunked and method == "orpo":
        trainer.unpad = speed["unpad"]
    elif chunked:
        use_chunked_head(
            trainer.model.get_base_model(),
            speed["unpad"],
            getattr(trainer, "use_weighting", False),
            paired=method == "dpo",
        )
    return speed


def train_preference(job: PreferenceJob, reporter: Reporter) -> dict:
    from . import lm_head

    p = prepare(job)
    out = Path(job.output_dir)
    callback = progress_callback(reporter, out)
    chunked = lm_head.use_chunked(p.speed, p.model, p.lora.peft_target_modules(), reporter)
    trainer = build_trainer(job, p, callback, chunked)
    speed = use_speed(trainer, p, chunked, job.settings.method, reporter)
    result = run_trainer(trainer, callback, job, reporter)
    kto = job.settings.method == "kto"
    summary = {
        "method": job.settings.method,
        "beta": job.settings.beta,
        "global_step": trainer.state.global_step,
        "speed": speed,
        "train_loss": result.training_loss,
        "held_out": bool(p.eval_rows),
        "eval_rows" if kto else "eval_pairs": len(p.eval_rows),
    }
    if kto:
        labels = [bool(r["label"]) for r in unpaired(p.train_rows)]
        summary.update(
            train_liked=sum(labels), train_disliked=len(labels) - sum(labels), **kto_weights(job.settings, labels)
        )
    logged = progress.read(out)
    losses = [r["loss"] for r in logged if isinstance(r.get("loss"), (int, float))]
    summary.update(first_loss=losses[0] if losses else None, last_loss=losses[-1] if losses else None)
    if p.eval_rows:  # every rank: the evaluation is sharded across them
        reporter.log(f"evaluating on {len(p.eval_rows)} held-out {'rated replies' if kto else 'pairs'}")
        figures = trainer.evaluate()
        summary.update(
            pref_accuracy=figures.get("eval_rewards/accuracies"),
            reward_margin=figures.get("eval_rewards/margins"),
            preference_loss=figures.get("eval_loss"),
        )  # the DPO/ORPO objective, not a language-model NLL
        if kto and distributed.is_main():  # TRL's KTO logs no accuracy: per reply, as DPO's pairs have it
            trainer.model.eval()
            summary.update(
                kto_accuracy(trainer.model, p.tokenizer, p.eval_rows, job.settings.beta, p.args.max_seq_len),
                kl=figures.get("eval_kl"),
            )
    if not distributed.is_main():  # rank 0 samples and writes the artifact
        return {**summary, "rank": distributed.rank()}
    rows = (p.eval_rows or p.train_rows)[: job.settings.n_samples]
    trainer.model.eval()
    replies = generate(
        trainer.model, p.tokenizer, [r["prompt"] for r in rows], max_new_tokens=job.settings.max_new_tokens
    )
    with (out / "samples.jsonl").open("w") as f:
        for row, reply in zip(rows, replies):
            given = (
                {"reply": row["completion"][-1]["content"], "label": bool(row["label"])}
                if "completion" in row
                else {"chosen": row["chosen"][-1]["content"], "rejected": row["rejected"][-1]["content"]}
            )
            f.write(
                json.dumps({"prompt": row["prompt"][-1]["content"], **given, "generated": reply}, ensure_ascii=False)
                + "\n"
            )
    (out / "metrics.json").write_text(json.dumps(summary, indent=2))
    progress.plot_loss(logged, out / "loss.png", title=f"{job.settings.method.upper()} training loss")
    final = {
        "eval/pref_accuracy": summary.get("pref_accuracy"),
        "eval/reward_margin": summary.get("reward_margin"),
        f"eval/{job.settings.method}_loss": summary.get("preference_loss"),
    }
    reporter.metrics(trainer.state.global_step, {k: v for k, v in final.items() if v is not None})
    return summary
