"""Held-out evaluation while training, early stopping and the step the adapter keeps, for every trainer kind.

Through transformers' own machinery: eval_strategy/eval_steps score the trainer's eval_dataset every eval_every
steps, EarlyStoppingCallback stops when metric_for_best_model has not improved for `patience` evaluations, and
load_best_model_at_end loads the best evaluation's checkpoint into the model before run_trainer saves the adapter.
What this module adds: the held-out rows sampled to max_eval_rows, the arguments lined up so transformers accepts
them (a checkpoint at every evaluation for `keep: best`), and the typed account of where training stopped and why.
"""

from __future__ import annotations

import random
from typing import Any

from ..config.results import HeldOutRows, KeptAdapter
from ..config.training import TrainArgs


def sample_rows(rows: list[dict], max_rows: int | None, seed: int) -> list[dict]:
    """At most max_rows of the held-out rows, drawn with the seed: the same rows for the same split and seed, in
    the split's order (so the first n_samples of them stay a stable choice too)."""
    if max_rows is None or len(rows) <= max_rows:
        return rows
    chosen = sorted(random.Random(seed).sample(range(len(rows)), max_rows))
    return [rows[i] for i in chosen]


def trainer_arguments(args: TrainArgs) -> dict[str, Any]:
    """What the trainer's config takes from eval_every, early_stopping and keep (nothing when eval_every is unset).

    metric_for_best_model is set whenever the held-out rows are scored, so the trainer tracks the best step (for
    the manifest) even when the last is kept. With keep: best, transformers wants save_steps to be a multiple of
    eval_steps, and the best evaluation's checkpoint must exist to be loaded: a checkpoint is saved at every
    evaluation (an adapter's worth of disk; save_total_limit keeps the best and the newest)."""
    if args.eval_every is None:
        return {"eval_strategy": "no"}
    best = args.keep == "best"
    return {
        "eval_strategy": "steps",
        "eval_steps": args.eval_every,
        "metric_for_best_model": args.best_metric(),
        "greater_is_better": args.greater_is_better(),
        "load_best_model_at_end": best,
        **({"save_steps": args.eval_every} if best else {}),
    }


def callbacks(args: TrainArgs) -> list:
    """transformers' EarlyStoppingCallback when the stage asks for early stopping."""
    if args.early_stopping is None:
        return []
    from transformers import EarlyStoppingCallback

    return [EarlyStoppingCallback(args.early_stopping.patience, args.early_stopping.min_delta)]


def eval_dataset(rows: list[dict], args: TrainArgs, build):
    """The trainer's eval_dataset: the held-out rows built as the kind builds its training rows (build), only
    when they are scored while training (TRL would otherwise prepare them for nothing)."""
    check_rows(rows, args)
    return build(rows) if args.eval_every is not None else None


def check_rows(rows: list[dict], args: TrainArgs) -> None:
    """Refuse eval_every without held-out rows before training (transformers would fail at the first evaluation,
    steps into the run)."""
    if args.eval_every is not None and not rows:
        raise ValueError(
            "args.eval_every scores the held-out rows while training, and this stage has none: give its dataset "
            "a held-out split (eval_frac above 0; for grpo, rloo and distill also max_eval_prompts above 0), or "
            "remove eval_every (and early_stopping, keep: best)"
        )


def kept_adapter(trainer, args: TrainArgs) -> KeptAdapter | None:
    """Which step the saved adapter holds and why, from the trainer's state after training (None: no held-out
    evaluation while training)."""
    if args.eval_every is None:
        return None
    state = trainer.state
    metric = args.best_metric()
    key = metric if metric.startswith("eval_") else f"eval_{metric}"
    evaluations = [e for e in state.log_history if key in e and "step" in e]
    from transformers import EarlyStoppingCallback

    stopper = next((c for c in trainer.callback_handler.callbacks if isinstance(c, EarlyStoppingCallback)), None)
    stopped = bool(
        stopper
        and stopper.early_stopping_patience_counter >= stopper.early_stopping_patience
        and state.global_step < state.max_steps
    )
    best_loaded = args.keep == "best" and state.best_model_checkpoint is not None
    return KeptAdapter(
        keep=args.keep,
        step=state.best_global_step if best_loaded else state.global_step,
        metric=metric,
        greater_is_better=args.greater_is_better(),
        best_step=state.best_global_step,
        best_metric=state.best_metric,
        evaluations=len(evaluations),
        eval_every=args.eval_every,
        last_step=state.global_step,
        planned_steps=state.max_steps,
        stopped_early=stopped,
        patience=stopper.early_stopping_patience if stopper else None,
    )


def held_out_rows(scored: int, total: int) -> HeldOutRows | None:
    """How many held-out rows were scored, out of the split's (None: the stage had no held-out split)."""
    return HeldOutRows(scored=scored, total=total) if total else None
