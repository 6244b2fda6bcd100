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
- base: the `Reward` model every type extends, `RewardError`, and the option types the types share
  (`Number`, `Whole`, `Strings`).
- reference: exact, contains, numeric (accuracy; they need the row's reference).
- format: regex, json, length, keyword (format; they shape the reply).
- command: the command reward (accuracy); `run_command` (engine/commands.py) runs its argv.
- custom: the custom reward (accuracy) and `call_with_timeout`.
- tool_call: the tool_call reward (format): the completion's tool calls against the pipeline's tools.
- learned: the reward_model reward (learned): a reward_model stage's model scores the reply, normalized per group.
- spec: the table of the types, `RewardSpec` (their union on `type`) and `parse_reward`, a plain mapping read as
  the model of its type, pydantic's errors worded as one message.
- set: `RewardSet`, `RewardScores`, `score_rows` and the TRL adapter `trl_reward_funcs`.

Framework-free: pydantic and the stdlib, plus the text matchers of the evaluation, so scoring matches it exactly.
"""

from __future__ import annotations

from .base import Reward, RewardError
from .command import CommandReward
from .custom import CustomReward
from .format import JsonReward, KeywordReward, LengthReward, RegexReward
from .learned import RewardModelReward
from .reference import ContainsReward, ExactReward, NumericReward
from .set import RewardScores, RewardSet, score_rows, trl_reward_funcs
from .spec import (
    ACCURACY_TYPES,
    FORMAT_TYPES,
    LEARNED_TYPES,
    REWARD_MODELS,
    REWARD_TYPES,
    RewardSpec,
    check_known_types,
    known_types,
    parse_reward,
)
from .tool_call import ToolCallReward

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
