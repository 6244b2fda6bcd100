"""Held-out evaluation of a model on rows: loss and perplexity, greedy replies and their task metrics, rewards.

The same functions measure an adapter right after training, the base model and the merged model, so every
stage's eval/loss is computed one way and the numbers line up in MLflow. Prompt rows (no reference replies)
have no loss: their greedy replies are scored with rewards and, where the rows carry a reference, task metrics.
"""

from __future__ import annotations

import math
from statistics import mean

from ..data.row_parts import reply_text, user_text
from ..infer.generation import generate
from ..infer.logprobs import completion_loss
from ..rewards import ACCURACY_TYPES
from ..text.matchers import NUMBER, json_valid
from . import metrics as task_metrics

# Rewards that say right (1) or wrong: the report also gives the share of rows scoring 1.


def eval_metrics(figures: dict) -> dict[str, float]:
    """The metric names every stage and the report log, so MLflow lines them up: eval/loss,
    eval/perplexity, eval/<task metric>, and on prompts eval/reward (weighted), eval/reward_<name> and
    eval/accuracy_<name> (share scoring 1). Only finite numbers: an absent loss is not logged."""
    out = {"eval/loss": figures.get("eval_loss"), "eval/perplexity": figures.get("perplexity")}
    out.update({f"eval/{k}": v for k, v in (figures.get("metrics") or {}).items()})
    if "reward" in figures:
        out["eval/reward"] = figures["reward"]
    out.update({f"eval/reward_{k}": v for k, v in (figures.get("rewards") or {}).items()})
    out.update({f"eval/accuracy_{k}": v for k, v in (figures.get("accuracy") or {}).items()})
    out.update({f"eval/tools/{k}": v for k, v in (figures.get("tools") or {}).items() if k != "conversations"})
    return {
        k: float(v)
        for k, v in out.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }


ALWAYS_METRICS = ["exact", "contains", "token_f1", "length_ratio"]


def choose_metrics(references: list[str], names: list[str] | None = None) -> list[str]:
    """The task metrics to compute: the pipeline's names when it gives them; otherwise exact, contains, token_f1
    and length_ratio, plus numeric when most references are a number and json_valid when most parse as JSON
    (so capital cities get no numeric or json_valid column that can only read 0)."""
    if names:
        return list(names)
    refs = [str(r).strip() for r in references]
    most = lambda test: bool(refs) and sum(map(test, refs)) > len(refs) / 2  # noqa: E731
    chosen = list(ALWAYS_METRICS)
    if most(lambda r: NUMBER.fullmatch(r.replace(" ", "")) is not None):
        chosen.insert(3, "numeric")
    if most(lambda r: r[:1] in "[{" and json_valid(r) == 1.0):
        chosen.insert(3, "json_valid")
    return chosen


def has_replies(rows: list[dict]) -> bool:
    """Whether the rows carry reference replies to measure a loss on (chat rows, pairs), not bare prompts."""
    return any("completion" in r or "chosen" in r for r in rows)


def evaluate_rows(
    model,
    tokenizer,
    rows: list[dict],
    n_samples: int | None = None,
    max_new_tokens: int = 128,
    max_len: int = 1024,
    metric_names: list[str] | None = None,
) -> dict:
    """Loss and perplexity on all rows; replies and task metrics on the first n_samples rows."""
    result = completion_loss(model, tokenizer, rows, max_len=max_len)
    sample_rows = rows if n_samples is None else rows[:n_samples]
    tools = sample_rows[0].get("tools") if sample_rows else None  # the pipeline's, the same in every row
    replies = generate(
        model, tokenizer, [r["prompt"] for r in sample_rows], max_new_tokens=max_new_tokens, tools=tools or None
    )
    references = [reply_text(r) for r in sample_rows]
    prompts = [user_text(r) for r in sample_rows]
    result["metrics"] = (
        task_metrics.score(replies, references, prompts, choose_metrics(references, metric_names)) if replies else {}
    )
    result["samples"] = [
        {"prompt": p, "reference": ref, "generated": g} for p, ref, g in zip(prompts, references, replies)
    ]
    return result


def reference_texts(rows: list[dict]) -> list[str] | None:
    """The rows' `reference` answers as text; None unless every row has one (task metrics need them all)."""
    refs = [r.get("reference") for r in rows]
    blank = [x is None or (isinstance(x, float) and math.isnan(x)) or not str(x).strip() for x in refs]
    return None if not refs or any(blank) else [str(x) for x in refs]


def score_prompt_rows(
    model, tokenizer, rows: list[dict], rewards=None, max_new_tokens: int = 128, metric_names: list[str] | None = None
) -> dict:
    """Greedy replies to prompt rows, which have no reference replies and so no loss (eval_loss and perplexity
    are None, never 0). With a RewardSet: the mean weighted reward, the mean per reward, and for accuracy-like
    rewards the share of rows scoring 1 (a failing reward scores 0 and is counted in reward_errors). Where
    every row has a `reference`: the task metrics against it."""
    replies = generate(model, tokenizer, [r["prompt"] for r in rows], max_new_tokens=max_new_tokens)
    prompts = [user_text(r) for r in rows]
    refs = reference_texts(rows)
    result: dict = {"eval_loss": None, "perplexity": None, "eval_tokens": 0}
    totals: list = [None] * len(rows)
    if rewards is not None and replies:
        scores = rewards.score(replies, rows, on_error="zero")
        totals = scores.total
        result["reward"] = mean(scores.total)
        result["rewards"] = {name: mean(values) for name, values in scores.scores.items()}
        result["accuracy"] = {
            r.name: mean(float(s >= 1.0 - 1e-9) for s in scores.scores[r.name])
            for r in rewards
            if r.type in ACCURACY_TYPES
        }
        result["reward_errors"] = scores.errors
    result["metrics"] = (
        task_metrics.score(replies, refs, prompts, choose_metrics(refs, metric_names)) if refs and replies else {}
    )
    result["samples"] = [
        {"prompt": p, "reference": "" if refs is None else ref, "generated": g, "reward": t}
        for p, ref, g, t in zip(prompts, refs or [""] * len(rows), replies, totals)
    ]
    return result
