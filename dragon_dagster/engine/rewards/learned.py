"""The reward_model reward (learned family): a reply scored by a reward model that a reward_model stage trained on
what people preferred, instead of by a check of a fact.

The spec names the stage (`stage:`), which makes the model an input of the stage that optimizes it (a lineage
edge in the asset graph); the worker that has the model loaded binds its scorer (`bind_scorers`), so the spec stays
plain data. A learned score has no fixed scale, so it is normalized before it is mixed with the verifiable rewards
by weight:

- group (default): in training, each completion's score against the other completions to the same prompt (minus
  their mean, over their standard deviation; 0 for a group that all scored the same), so its weight says how much
  its ranking of a group counts beside a 0/1 reward's; a lone reply (the held-out prompts scored before and after)
  gets the raw score, since there is nothing to rank it against.
- sigmoid: sigmoid(score) everywhere, a number in (0, 1) like a verifiable reward's.
- none: the raw score everywhere.

A policy that climbs a learned reward may be exploiting the model's mistakes rather than getting better: a stage
that optimizes one also reports rewards it was not trained on (the grpo kind's `guard`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from statistics import mean, pstdev
from typing import Any, ClassVar, Literal

from pydantic import Field, PrivateAttr, field_validator

from .base import Reward

# (prompts, replies) -> one score per reply; prompts are chat messages (or text), replies plain text
Scorer = Callable[[Sequence[Any], Sequence[str]], list[float]]


class RewardModelReward(Reward):
    """A learned reward: the score a reward_model stage's model gives the reply to its prompt."""

    family: ClassVar[Literal["accuracy", "format", "learned"]] = "learned"
    batched: ClassVar[bool] = True
    type: Literal["reward_model"] = "reward_model"
    stage: str = Field(description="The reward_model stage whose model scores the replies (an earlier stage).")
    normalize: Literal["group", "sigmoid", "none"] = Field(
        "group",
        description="How the score is scaled before the weighted sum: group (against the other completions to the "
        "same prompt, in training), sigmoid (into 0..1) or none (the raw score).",
    )
    _scorer: Scorer | None = PrivateAttr(None)

    @field_validator("stage")
    @classmethod
    def _a_stage(cls, stage: str) -> str:
        if not stage.strip():
            raise ValueError("needs the name of a reward_model stage earlier in the pipeline")
        return stage

    def bind_scorer(self, scorer: Scorer) -> None:
        self._scorer = scorer

    def scorer(self) -> Scorer:
        if self._scorer is None:
            raise self._fail(
                f"needs the model of stage {self.stage!r} loaded: a worker binds it (RewardSet.bind_scorers) before "
                "scoring"
            )
        return self._scorer

    def score(self, completion: str, reference: Any = None, prompt: str = "", row: Mapping | None = None) -> float:
        return self.score_many([completion], [row or {"prompt": prompt}], grouped=False)[0]

    def score_many(self, replies: Sequence[str], rows: Sequence[Mapping], grouped: bool = False) -> list[float]:
        """Score replies[i] as the answer to rows[i]'s prompt. grouped: the rows come as TRL lays out a step's
        completions, each prompt's group side by side, and normalize: group ranks within each group."""
        raw = self.scorer()([row.get("prompt", "") for row in rows], list(replies))
        if any(not math.isfinite(s) for s in raw):
            raise self._fail(f"the model of stage {self.stage!r} gave a non-finite score")
        if self.normalize == "sigmoid":
            return [1 / (1 + math.exp(-s)) for s in raw]
        if self.normalize == "none" or not grouped:
            return raw
        return within_groups(raw, [_prompt_key(row.get("prompt")) for row in rows])


def within_groups(scores: list[float], keys: list[str]) -> list[float]:
    """Each score against the run of equal keys it belongs to: (score - mean) / std, 0 where they are all equal
    or the run has one member."""
    out: list[float] = []
    start = 0
    while start < len(scores):
        end = start
        while end < len(scores) and keys[end] == keys[start]:
            end += 1
        group = scores[start:end]
        centre, spread = mean(group), pstdev(group)
        out += [(s - centre) / spread if spread > 1e-8 else 0.0 for s in group]
        start = end
    return out


def _prompt_key(prompt: Any) -> str:
    return repr(prompt)
