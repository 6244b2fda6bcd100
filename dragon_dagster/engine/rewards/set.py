"""A set of rewards summed by weight, how it scores rows, and its adapter to TRL's GRPOTrainer."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import mean
from typing import Any

from ..text.matchers import last_number
from .base import Reward, RewardError, _blank, _some, _text
from .custom import CustomReward
from .spec import parse_reward

_TRL_EXTRAS = {"trainer_state", "log_extra", "log_metric", "environments"}  # TRL kwargs that are not columns


@dataclass
class RewardScores:
    """Per-reward scores for each row, their weighted total, and how many rows each reward failed on."""

    scores: dict[str, list[float]]
    total: list[float]
    errors: dict[str, int]

    def means(self) -> dict[str, float]:
        """Progress and evaluation columns: `reward` (weighted total) and `reward_<name>` per reward."""
        out = {"reward": mean(self.total) if self.total else float("nan")}
        out.update({f"reward_{n}": mean(v) if v else float("nan") for n, v in self.scores.items()})
        return out


class RewardSet:
    """Rewards summed by weight, with unique names.

    Specs are read with parse_reward, so a custom reward's relative file is resolved against base_dir (else
    the working directory) and must exist. A Reward given as a model is kept as it is, except a custom one when
    base_dir is given or its file is relative: that one is read again from its spec, so a reward validated as
    part of a pipeline stage (its file still as the YAML wrote it) gets its file resolved and checked the same.
    """

    def __init__(self, rewards: Iterable[Reward | Mapping] | Reward | Mapping, base_dir: str | Path | None = None):
        if isinstance(rewards, (Reward, Mapping)):
            rewards = [rewards]
        self.rewards = [_reward(r, base_dir) for r in rewards]
        if not self.rewards:
            raise RewardError("a reward set needs at least one reward")
        seen: set[str] = set()
        for r in self.rewards:
            if r.name in seen:
                raise RewardError(f"reward name {r.name!r} is used twice; give one of them another name")
            seen.add(r.name)

    @classmethod
    def from_list(
        cls, specs: Iterable[Reward | Mapping] | Reward | Mapping, base_dir: str | Path | None = None
    ) -> RewardSet:
        return cls(specs, base_dir=base_dir)

    def to_list(self, relative_to: str | Path | None = None) -> list[dict[str, Any]]:
        return [r.to_dict(relative_to) for r in self.rewards]

    def __iter__(self):
        return iter(self.rewards)

    def __len__(self) -> int:
        return len(self.rewards)

    @property
    def names(self) -> list[str]:
        return [r.name for r in self.rewards]

    def weights(self) -> list[float]:
        """In reward order, for GRPOConfig.reward_weights."""
        return [r.weight for r in self.rewards]

    def bind_tools(self, schemas: list[dict] | None) -> RewardSet:
        """Give the rewards that check tool calls (tool_call) the pipeline's tool schemas; returns self."""
        for r in self.rewards:
            if schemas is not None and hasattr(r, "bind_tools"):
                r.bind_tools(schemas)
        return self

    def bind_scorers(self, scorers: Mapping[str, Callable]) -> RewardSet:
        """Give each reward_model reward the scorer of the stage it names (scorers: stage name -> scorer); returns
        self. A reward whose stage has no scorer fails when it scores, naming the stage."""
        for r in self.rewards:
            stage = getattr(r, "stage", None)
            if stage is not None and stage in scorers:
                r.bind_scorer(scorers[stage])
        return self

    def localize(self, run_dir: str | Path) -> list[Reward]:
        """The rewards with their custom files copied into run_dir/rewards/ and named relative to run_dir (a job's
        output directory: the worker resolves them there)."""
        return [r.localize(run_dir) for r in self.rewards]

    def check_rows(self, rows: Sequence[Mapping], load_custom: bool = True) -> None:
        """Fail before training if a reward cannot work on this dataset (no reference, broken custom file).

        load_custom=False checks everything but the custom files' code: the Dagster step process checks that
        way, and only the worker imports and runs a custom file (it runs with the user's rights)."""
        for r in self.rewards:
            if isinstance(r, CustomReward) and load_custom:
                r.load()
            if not r.needs_reference:
                continue
            missing = [i for i, row in enumerate(rows) if _blank(row.get("reference"))]
            if missing and len(missing) == len(rows):
                raise r._fail(
                    "compares against a reference, but the dataset lacks a reference; "
                    "map a reference column or use a reward that needs none"
                )
            if missing:
                raise r._fail(
                    f"compares against a reference, but {len(missing)} of {len(rows)} rows lack one "
                    f"(rows {_some(missing)})"
                )
            if r.type == "numeric":
                # Without a number in the reference every completion scores 0: no signal, only wasted compute.
                bad = [i for i, row in enumerate(rows) if last_number(str(row["reference"])) is None]
                if bad:
                    raise r._fail(f"needs a number in each reference; {len(bad)} rows have none (rows {_some(bad)})")

    def score(
        self, completions: Sequence[Any], rows: Sequence[Mapping], on_error: str = "raise", grouped: bool = False
    ) -> RewardScores:
        """Score completions[i] against rows[i]. on_error="zero" scores a failing row 0 and counts it. grouped: the
        rows are a GRPO step's completions, each prompt's group side by side (a learned reward ranks within it)."""
        if len(completions) != len(rows):
            raise RewardError(f"{len(completions)} completions for {len(rows)} rows")
        scores, errors = {}, {}
        for r in self.rewards:
            scores[r.name], errors[r.name] = score_rows(r, completions, rows, on_error, grouped)
        total = [sum(r.weight * scores[r.name][i] for r in self.rewards) for i in range(len(rows))]
        return RewardScores(scores, total, errors)


def _reward(reward: Reward | Mapping, base_dir: str | Path | None) -> Reward:
    """A model as it is, its files found (a custom reward validated inside a stage keeps its file as the YAML
    wrote it); a plain mapping (a JSON file) read as the model of its type."""
    return reward.resolved(base_dir) if isinstance(reward, Reward) else parse_reward(reward, base_dir)


def score_rows(
    reward: Reward, completions: Sequence[Any], rows: Sequence[Mapping], on_error: str = "raise", grouped: bool = False
) -> tuple[list[float], int]:
    """One reward over aligned completions and rows: the scores and the number of rows that failed (a batched
    reward fails or scores the batch as a whole)."""
    if on_error not in ("raise", "zero"):
        raise RewardError(f"on_error must be 'raise' or 'zero', got {on_error!r}")
    # a conversation (a rollout with tools): the rewards read its final answer, tool_call its calls
    rows = [
        {**row, "completion_messages": list(c)} if isinstance(c, (list, tuple)) else row
        for c, row in zip(completions, rows)
    ]
    if reward.batched:
        try:
            return reward.score_many([_text(c, "assistant") for c in completions], rows, grouped), 0
        except Exception as e:
            if on_error == "raise":
                raise RewardError(f"reward {reward.name!r} failed on a batch: {type(e).__name__}: {e}") from e
            return [0.0] * len(rows), len(rows)
    out, failed = [], 0
    for i, (completion, row) in enumerate(zip(completions, rows)):
        try:
            out.append(
                reward.score(
                    _text(completion, "assistant"), row.get("reference"), _text(row.get("prompt", ""), "user"), row
                )
            )
        except Exception as e:
            if on_error == "raise":
                where = f" in {reward.file}" if isinstance(reward, CustomReward) else ""
                raise RewardError(f"reward {reward.name!r}{where} failed on row {i}: {type(e).__name__}: {e}") from e
            out.append(0.0)
            failed += 1
    return out, failed


def trl_reward_funcs(rewards: RewardSet | Iterable[Reward | Mapping], on_error: str = "raise") -> list[Callable]:
    """One TRL reward function per reward, named after it; give TRL the weights via GRPOConfig.reward_weights.

    Each has TRL's signature f(prompts, completions, completion_ids=None, **columns) -> list[float] and an
    `errors` attribute counting the rows it scored 0 because the reward failed (with on_error="zero").
    """
    reward_set = rewards if isinstance(rewards, RewardSet) else RewardSet(rewards)
    return [_trl_func(r, on_error) for r in reward_set]


def _trl_func(reward: Reward, on_error: str) -> Callable:
    def func(prompts, completions, completion_ids=None, **kwargs) -> list[float]:
        rows = _trl_rows(prompts, kwargs)
        scores, failed = score_rows(reward, completions, rows, on_error, grouped=True)
        func.errors += failed
        return scores

    func.__name__ = func.__qualname__ = reward.name  # TRL logs rewards/<__name__>/mean
    func.errors = 0
    func.reward = reward
    return func


def _trl_rows(prompts: Sequence[Any], kwargs: Mapping[str, Any]) -> list[dict]:
    """TRL passes each dataset column as a keyword list aligned with the completions; rebuild the rows."""
    n = len(prompts)
    columns = {k: v for k, v in kwargs.items() if k not in _TRL_EXTRAS and isinstance(v, (list, tuple)) and len(v) == n}
    return [{"prompt": p, **{k: v[i] for k, v in columns.items()}} for i, p in enumerate(prompts)]
