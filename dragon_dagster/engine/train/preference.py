"""What the preference kinds share (stages/dpo, stages/orpo, stages/kto: one TRL config/trainer pair each): their
settings base, the training run around the method's trainer, the held-out figures and the samples.

With PEFT, DPO and KTO need no separate reference model: the policy with its adapter switched off is the
reference, which is the model the stage started from (earlier adapters already folded in).

No LoRA dropout: TRL's DPOConfig, KTOConfig and trl.experimental.orpo's ORPOConfig default disable_dropout=True,
and their trainers then set every torch Dropout of the PEFT-wrapped model to p=0 (trl.trainer.utils
.disable_dropout_in_model), LoRA's dropout included. So the preference kinds' lora.dropout defaults to 0 and a
value above 0 is refused when the pipeline loads, instead of being silently zeroed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, model_validator

from ..artifacts import progress
from ..config.reporter import Reporter
from ..config.results import TrainingResult, fig
from ..config.stage import Continues
from ..config.training import Lora, TrainArgs
from ..evaluate.plots import plot_loss
from ..infer.generation import generate
from . import distributed, held_out
from .stage import ROW_SHAPES, TrainerStage, check_trains_on
from .trainer import (
    TrainingError,
    TrainingJob,
    apply_speed,
    lora_config,
    prepare,
    progress_callback,
    rows_for_steps,
    run_trainer,
)
from .trl_config import TrainerRun, trl_config


class PreferenceArgs(TrainArgs):
    """dragon_prefer's defaults: a lower learning rate and fewer passes than SFT."""

    epochs: float = Field(2, gt=0, description="Passes over the training pairs.")
    learning_rate: float = Field(5e-5, gt=0, allow_inf_nan=False, description="Peak learning rate of the LoRA weights.")


class PreferenceLora(Lora):
    """The preference kinds' adapter shape: no dropout by default (TRL's preference trainers disable it)."""

    dropout: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="Must stay 0: TRL's DPO, KTO and ORPO trainers set every dropout to 0 (disable_dropout), "
        "LoRA's included, so a value above 0 is refused rather than silently ignored.",
    )


class PreferenceStage(TrainerStage):
    """Preference optimization on rows people (or a judge) preferred, continuing from the stage before it."""

    continues: ClassVar[Continues] = "required"  # a preference is over the replies of a model that exists
    trains_on: ClassVar[tuple[str, ...]] = ("pairs",)
    trl_config: ClassVar[str] = "TRL's preference config"  # the config class whose disable_dropout zeroes dropout

    beta: float = Field(0.1, gt=0, allow_inf_nan=False, description="Strength of the preference (KL to the start).")
    lora: PreferenceLora = Field(
        default_factory=PreferenceLora, description="The adapter's shape (dragon_lora); dropout stays 0."
    )
    args: PreferenceArgs = Field(default_factory=PreferenceArgs, description="Trainer arguments.")

    @model_validator(mode="after")
    def _no_lora_dropout(self):
        refuse_lora_dropout(self)
        return self

    def check_inputs(self, pipeline) -> None:
        check_trains_on(self, pipeline)


PREFERENCE_NAMES = {"args.max_seq_len": "max_length"}  # what the preference kinds name otherwise than TRL


def preference_config(config_class: type, settings: PreferenceStage, run: TrainerRun, **given: Any):
    """A preference kind's TRL config: its settings by name (beta and the kind's own; PREFERENCE_NAMES where
    TRL's differ). given: what the kind sets from its rows (KTO's balanced weights)."""
    # TRL's default, stated: why PreferenceStage refuses lora.dropout > 0
    return trl_config(config_class, settings, run, PREFERENCE_NAMES, disable_dropout=True, **given)


def refuse_lora_dropout(stage: TrainerStage) -> None:
    """A LoRA dropout above 0 would be silently 0: the stage's TRL config disables every dropout (trl_config)."""
    if stage.lora.dropout > 0:
        raise ValueError(
            f"stage {stage.name!r} ({stage.kind}): lora.dropout {stage.lora.dropout} would be silently 0 in "
            f"training: {stage.trl_config} has disable_dropout=True, which sets every dropout of the model to 0, "
            f"LoRA's included, when the trainer is built. Remove lora.dropout from the stage (the {stage.kind} "
            "default is 0) or set it to 0"
        )


class PreferenceResult(TrainingResult):
    """A preference stage's figures on its held-out rows (TRL's evaluate: the method's loss, the share of pairs
    whose chosen reply gains more than the rejected one, and the mean margin between them)."""

    beta: float
    eval_pairs: int | None = None  # held-out pairs (a KTO stage counts rated replies: eval_rows)
    pref_accuracy: float | None = None
    reward_margin: float | None = None
    preference_loss: float | None = None  # the method's own objective, not a language-model NLL

    def own_figures(self) -> dict[str, Any]:
        return {
            "preference_loss": self.preference_loss,
            "pref_accuracy": self.pref_accuracy,
            "reward_margin": self.reward_margin,
        }

    @classmethod
    def headline(cls, metrics: dict[str, float]) -> str:
        """Its own figures, never eval/loss (a preference objective is no NLL)."""
        names = [
            "pref_accuracy",
            "reward_margin",
            *sorted(k[5:] for k in metrics if k.startswith("eval/") and k.endswith("_loss") and k != "eval/loss"),
        ]
        parts = [f"{name} {fig(metrics[f'eval/{name}'])}" for name in names if f"eval/{name}" in metrics]
        if not parts and "train/loss" in metrics:
            parts.append(f"train loss {fig(metrics['train/loss'])}")
        return ", ".join(parts)


def check_rows(stage: PreferenceStage, rows: list[dict]) -> None:
    """Refuse data the kind cannot train on, naming what it needs (a dataset's rows can be anything at run time)."""
    shapes = {
        "pairs": all("chosen" in r and "rejected" in r for r in rows),
        "rated": all("label" in r and "completion" in r for r in rows),
    }
    if not any(shapes[s] for s in stage.trains_on):
        given = next((s for s, ok in shapes.items() if ok), "neither pairs nor rated replies")
        raise TrainingError(
            f"{stage.kind} trains on {' or '.join(ROW_SHAPES[s] for s in stage.trains_on)}; these rows are "
            f"{ROW_SHAPES.get(given, given)}: use a dataset of {stage.trains_on[0]}"
            + (f", or a kind that trains on {ROW_SHAPES[given]}" if given in ROW_SHAPES else "")
        )


def trainer_parts(p, callback, train=None, evals=None) -> dict[str, Any]:
    """What every preference trainer is built with besides its model and config: the rows as datasets (the rows
    its steps reach, p.trained_rows; train and evals given when the method reshapes them), the tokenizer, the LoRA
    adapter and the progress callback."""
    from datasets import Dataset

    held_out.check_rows(p.eval_rows, p.args)
    if train is None:
        train = Dataset.from_list(p.trained_rows)
        evals = Dataset.from_list(p.eval_rows) if p.eval_rows else None
    return {
        "train_dataset": train,
        "eval_dataset": evals,
        "processing_class": p.tokenizer,
        "peft_config": lora_config(p.lora),
        "callbacks": [callback, *held_out.callbacks(p.args)],  # early stopping on the eval_dataset's figures
    }


class PreferenceMethod:
    """One preference kind's part of the run: its TRL trainer, where the chunked head goes, its own figures."""

    result: ClassVar[type[PreferenceResult]] = PreferenceResult
    held_out: ClassVar[str] = "pairs"  # what the held-out rows are called in the log

    def trainer(self, job: TrainingJob, p, run: TrainerRun, callback, chunked: bool):
        """The kind's TRL trainer, its config built by the kind's to_trl_config(job.settings, run)."""
        raise NotImplementedError

    def use_head(self, trainer, speed: dict) -> None:
        """Put the chunked head where the trainer scores (called only when it is on)."""

    def train_figures(self, job: TrainingJob, p) -> dict[str, Any]:
        return {}

    def eval_figures(self, job: TrainingJob, p, trainer, figures: dict) -> dict[str, Any]:
        return {}


def train_preference(job: TrainingJob, reporter: Reporter, method: PreferenceMethod) -> PreferenceResult | None:
    from . import lm_head  # torch: loaded by the worker that trains, not by whoever reads a result

    p = prepare(job)
    settings, out = job.settings, Path(job.output_dir)
    callback = progress_callback(reporter, out)
    chunked = lm_head.use_chunked(p.speed, p.model, p.lora.peft_target_modules(), reporter)
    run = TrainerRun.of(job, p.speed, compiled_here=chunked, workers=p.workers)
    check_rows(settings, p.train_rows)
    p.reached_rows = rows_for_steps(p.train_rows, p.args, reporter)  # the trainer tokenizes only these
    trainer = method.trainer(job, p, run, callback, chunked)
    speed = apply_speed(trainer, p.speed, chunked, reporter)
    if chunked:
        method.use_head(trainer, speed)
    result = run_trainer(trainer, callback, job, reporter)
    summary: dict[str, Any] = {
        "objective": settings.objective(),
        "loss_label": f"{settings.objective().upper()} loss",
        "beta": settings.beta,
        "global_step": trainer.state.global_step,
        "speed": speed,
        "train_loss": result.training_loss,
        "held_out": bool(p.eval_rows),
        "kept": held_out.kept_adapter(trainer, p.args),
        "held_out_rows": held_out.held_out_rows(len(p.eval_rows), p.eval_total),
        **method.train_figures(job, p),
    }
    logged = progress.read(out)
    losses = [r["loss"] for r in logged if isinstance(r.get("loss"), (int, float))]
    summary.update(first_loss=losses[0] if losses else None, last_loss=losses[-1] if losses else None)
    if p.eval_rows:  # every rank: the evaluation is sharded across them
        reporter.log(f"evaluating on {summary['held_out_rows'].sentence()} held-out {method.held_out}")
        figures = trainer.evaluate()
        summary.update(
            pref_accuracy=figures.get("eval_rewards/accuracies"),
            reward_margin=figures.get("eval_rewards/margins"),
            preference_loss=figures.get("eval_loss"),
        )
        summary.update(method.eval_figures(job, p, trainer, figures))
    if not distributed.is_main():  # rank 0 samples and writes the artifact
        return None
    summary = method.result.model_validate(summary)
    write_samples(trainer.model, p.tokenizer, (p.eval_rows or p.train_rows)[: settings.n_samples], settings, out)
    (out / "metrics.json").write_text(summary.model_dump_json(indent=2))
    plot_loss(logged, out / "loss.png", title=f"{settings.objective().upper()} training loss")
    final = {
        "eval/pref_accuracy": summary.pref_accuracy,
        "eval/reward_margin": summary.reward_margin,
        f"eval/{settings.objective()}_loss": summary.preference_loss,
    }
    reporter.metrics(trainer.state.global_step, {k: v for k, v in final.items() if v is not None})
    return summary


def write_samples(model, tokenizer, rows: list[dict], settings: PreferenceStage, out: Path) -> None:
    """samples.jsonl: the adapter's greedy reply to each row's prompt, beside the reply (or pair) it was given."""
    model.eval()
    replies = generate(model, tokenizer, [r["prompt"] for r in rows], max_new_tokens=settings.max_new_tokens)
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
