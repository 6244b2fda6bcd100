"""Verifiable rewards for GRPO, as dragon_reward() defines them.

A verifiable reward scores one completion between 0 and 1 by checking a fact about the text (a number, a format,
a length, a test that passes) rather than asking a model's opinion. A `RewardSet` sums its rewards by weight;
each reward has a name, which labels its progress column (`reward_<name>`) and its evaluation score.

Types: exact, contains, numeric (compare with the row's reference), regex, json, length, keyword, command (runs
an argv, never a shell), tool_call (the completion's calls of the pipeline's tools), reward_model (a learned
reward: the score of a reward_model stage's model, not a verifiable check) and custom (a Python file
defining `reward(prompt, completion, reference, row)`, which returns a number; it is imported and run only in the
worker process, with the user's rights, each call limited to `timeout` seconds). Each type is a pydantic model
taking only its own options, and `RewardSpec` is their union on `type`, so a config model with
`rewards: list[RewardSpec]` validates them and its JSON schema names each option. `trl_reward_funcs()` adapts a
set to TRL's GRPOTrainer; pass `RewardSet.weights()` as `GRPOConfig.reward_weights` so TRL does the weighting
and logs each reward as `rewards/<name>/mean`.

Modules:
- base: the `Reward` model every type extends, `RewardError`, the option types the types share (`Number`,
  `Whole`, `Strings`) and how `Reward.from_dict` words pydantic's errors.
- reference: exact, contains, numeric (accuracy; they need the row's reference).
- format: regex, json, length, keyword (format; they shape the reply).
- command: the command reward (accuracy); `run_command` (engine/commands.py) runs its argv.
- custom: the custom reward (accuracy) and `call_with_timeout`.
- tool_call: the tool_call reward (format): the completion's tool calls against the pipeline's tools.
- learned: the reward_model reward (learned): a reward_model stage's model scores the reply, normalized per group.
- set: `RewardSet`, `RewardScores`, `score_rows` and the TRL adapter `trl_reward_funcs`.

Framework-free: pydantic and the stdlib, plus the text matchers of the evaluation, so scoring matches it exactly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Union

from pydantic import Field, model_validator

from .base import Reward, RewardError
from .command import CommandReward
from .custom import CustomReward
from .format import JsonReward, KeywordReward, LengthReward, RegexReward
from .learned import RewardModelReward
from .reference import ContainsReward, ExactReward, NumericReward
from .set import RewardScores, RewardSet, score_rows, trl_reward_funcs
from .tool_call import ToolCallReward

# Every reward type's model, once: the union a config validates and the table by type name both come from it.
REWARD_MODELS: tuple[type[Reward], ...] = (
    ExactReward,
    ContainsReward,
    NumericReward,
    RegexReward,
    JsonReward,
    LengthReward,
    KeywordReward,
    CommandReward,
    CustomReward,
    ToolCallReward,
    RewardModelReward,
)
# One reward spec: the model of its `type`. Use list[RewardSpec] as a field type to validate a list of them.
RewardSpec = Annotated[Union[REWARD_MODELS], Field(discriminator="type")]  # noqa: UP007 - built from the tuple
REWARD_TYPES: dict[str, type[Reward]] = {model._type_name(): model for model in REWARD_MODELS}
# How checks and reports read a reward: accuracy-like ones score right or wrong (their mean is a share);
# format-like ones shape the reply, and rising while accuracy falls is the mark of reward hacking.
ACCURACY_TYPES = tuple(kind for kind, model in REWARD_TYPES.items() if model.family == "accuracy")
FORMAT_TYPES = tuple(kind for kind, model in REWARD_TYPES.items() if model.family == "format")
# Learned rewards (a model's opinion) are what a policy can exploit: a stage optimizing one watches a guard.
LEARNED_TYPES = tuple(kind for kind, model in REWARD_TYPES.items() if model.family == "learned")


def parse_reward(spec: Any, base_dir: str | Path | None = None) -> Reward:
    """The reward a plain mapping describes (Reward.from_dict); a custom reward's relative file is resolved
    against base_dir (else the working directory) and must exist."""
    return Reward.from_dict(spec, base_dir)


def check_known_types(specs: Any, where: str) -> None:
    """Name an unknown reward type as such, with the known ones (a tagged union alone would only say that no tag
    matched). where: how the list is called in its model's messages, e.g. "rewards" or "gate.taste"."""
    for i, reward in enumerate(specs or []):
        kind = reward.get("type") if isinstance(reward, dict) else getattr(reward, "type", None)
        if kind not in REWARD_TYPES:
            raise ValueError(f"{where}[{i}]: unknown reward type {kind!r}; known: {', '.join(REWARD_TYPES)}")


def known_types(field: str, where: str) -> Any:
    """A model's before-validator running check_known_types on its `field` (a list of rewards), so every model
    holding rewards names an unknown type the same way: `_known = known_types("rewards", "rewards")`."""

    def check(cls, data: Any) -> Any:
        if isinstance(data, dict):
            check_known_types(data.get(field), where)
        return data

    return model_validator(mode="before")(classmethod(check))


__all__ = [
    "ACCURACY_TYPES",
    "FORMAT_TYPES",
    "LEARNED_TYPES",
    "REWARD_MODELS",
    "REWARD_TYPES",
    "CommandReward",
    "ContainsReward",
    "CustomReward",
    "ExactReward",
    "JsonReward",
    "KeywordReward",
    "LengthReward",
    "NumericReward",
    "RegexReward",
    "Reward",
    "RewardError",
    "RewardModelReward",
    "RewardScores",
    "RewardSet",
    "RewardSpec",
    "ToolCallReward",
    "check_known_types",
    "known_types",
    "parse_reward",
    "score_rows",
    "trl_reward_funcs",
]
