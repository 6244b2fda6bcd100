"""Did a retraining learn what people liked? Figures on the held-out feedback (conversations never trained
on), the model the retraining started from against the retrained one; the promotion gate reads them.

- reward: for each held-out rated reply (liked, edited, disliked; a held-out pair counts as its two replies),
  how much the retrained model raised its mean per-token log-probability over the starting model, signed + for
  liked and - for disliked replies; the mean. The starting model scores 0 by definition, so this is the gain:
  above 0, the model moved towards what people liked and away from what they did not.
- pair_accuracy: the share of held-out pairs whose chosen reply has the higher mean per-token log-probability.
- liked_share: with a taste (rewards that say which replies are liked), fresh greedy replies to the held-out
  prompts scored, and the share scoring at least liked_at.

Mean per-token log-probabilities, not sums: a long disliked reply must not outweigh short liked ones.
"""

from __future__ import annotations

import json
from statistics import mean

from ..data.row_mapping import unpaired
from ..data.row_parts import user_text
from ..data.tables import read_jsonl


def held_out_feedback(files: dict[str, str | None]) -> tuple[list[dict], list[dict]]:
    """(rated replies, pairs) from the held-out files of the feedback datasets, by objective: conversations, pairs,
    rated replies, prompts; a liked or edited conversation is a liked reply. Duplicates counted once."""
    rated, pairs = [], []
    for path in files.values():
        rows = read_jsonl(path) if path else []
        if rows and "chosen" in rows[0]:  # a file of preference pairs: each pair is also its two rated replies
            pairs += rows
            rated += unpaired(rows)
        else:
            rated += [  # rows without a reply (rlhf's prompts) say nothing about a reply here
                {"prompt": r["prompt"], "completion": r["completion"], "label": r.get("label", True)}
                for r in rows
                if "completion" in r
            ]
    seen, unique = set(), []
    for row in rated:
        key = json.dumps([row["prompt"], row["completion"], row["label"]], sort_keys=True)
        if key not in seen:
            seen.add(key)
            unique.append(row)
    return unique, pairs


def _per_token(scored: list[tuple[float, int]]) -> list[float]:
    return [logp / max(1, n) for logp, n in scored]


def model_figures(
    model, tokenizer, rated: list[dict], pairs: list[dict], taste=None, max_len: int = 1024, max_new_tokens: int = 64
) -> dict:
    """One model's raw figures on the held-out feedback: per-token log-probabilities of the rated replies,
    whether each pair's chosen reply is the likelier, and with a taste the score of a fresh reply per prompt."""
    from ..infer.generation import generate
    from ..infer.logprobs import reply_logprobs

    out = {"logps": _per_token(reply_logprobs(model, tokenizer, rated, max_len)) if rated else []}
    if pairs:
        chosen = _per_token(reply_logprobs(model, tokenizer, pairs, max_len))
        rejected = _per_token(
            reply_logprobs(
                model, tokenizer, [{"prompt": p["prompt"], "completion": p["rejected"]} for p in pairs], max_len
            )
        )
        out["pair_wins"] = [c > r for c, r in zip(chosen, rejected)]
    if taste is not None:
        prompts = _prompts(rated)
        replies = generate(model, tokenizer, prompts, max_new_tokens=max_new_tokens)
        rows = [{"prompt": p} for p in prompts]
        out["taste_scores"] = taste.score(replies, rows, on_error="zero").total
        out["taste_samples"] = [{"prompt": user_text(r), "reply": reply} for r, reply in zip(rows, replies)]
    return out


def _prompts(rated: list[dict]) -> list[list[dict]]:
    """The distinct held-out prompts (turns before a rated reply), in order."""
    seen, prompts = set(), []
    for row in rated:
        key = json.dumps(row["prompt"], sort_keys=True)
        if key not in seen:
            seen.add(key)
            prompts.append(row["prompt"])
    return prompts


def gain(start: dict, retrained: dict, rated: list[dict], pairs: list[dict], liked_at: float = 1.0) -> dict:
    """The gate's figures from both models' raw figures: each metric's start, retrained and gain (None where
    there is nothing held out to measure it on), and what was held out."""
    liked = sum(bool(r["label"]) for r in rated)
    figures = {
        "held_out": {
            "rated_replies": len(rated),
            "liked": liked,
            "disliked": len(rated) - liked,
            "pairs": len(pairs),
            "prompts": len(_prompts(rated)),
        },
        "reward": None,
        "pair_accuracy": None,
        "liked_share": None,
    }
    if rated:
        signed = [(a - b) * (1 if r["label"] else -1) for a, b, r in zip(retrained["logps"], start["logps"], rated)]
        figures["reward"] = {
            "start": 0.0,
            "retrained": mean(signed),
            "gain": mean(signed),
            "right_way": sum(s > 0 for s in signed) / len(signed),
        }
    if pairs:
        before, after = mean(start["pair_wins"]), mean(retrained["pair_wins"])
        figures["pair_accuracy"] = {"start": before, "retrained": after, "gain": after - before}
    if "taste_scores" in start and start["taste_scores"]:
        before = mean(s >= liked_at for s in start["taste_scores"])
        after = mean(s >= liked_at for s in retrained["taste_scores"])
        figures["liked_share"] = {"start": before, "retrained": after, "gain": after - before, "liked_at": liked_at}
    return figures
