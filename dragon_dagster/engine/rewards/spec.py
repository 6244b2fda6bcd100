"""A reward spec: the table of the reward types, their union on `type`, and a plain mapping (YAML, config.json)
read as the model of its type, with pydantic's errors worded as one message that names the reward, each option at
fault and what it takes."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Union

from pydantic import Field, ValidationError, model_validator
from pydantic_core import ErrorDetails

from .base import FILES_FROM, Reward, RewardError, _failure
from .command import CommandReward
from .custom import CustomReward
from .format import JsonReward, KeywordReward, LengthReward, RegexReward
from .learned import RewardModelReward
from .reference import ContainsReward, ExactReward, NumericReward
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
    """The reward a plain mapping describes, as the model of its type. A custom reward's relative `file` is
    resolved against base_dir (else the working directory) and must exist."""
    if not isinstance(spec, Mapping) or "type" not in spec:
        raise RewardError(f"a reward spec must be a mapping with a type, got {spec!r}")
    kind = spec["type"]
    model = REWARD_TYPES.get(kind) if isinstance(kind, str) else None
    if model is None:
        raise RewardError(f"unknown reward type {kind!r}; known: {', '.join(REWARD_TYPES)}")
    try:
        return model.model_validate(spec, context={FILES_FROM: base_dir})
    except ValidationError as e:
        error = _reward_error(e, spec, model)
    raise error from None  # outside the except: no pydantic traceback around the reward's message


def _reward_error(error: ValidationError, spec: Mapping[str, Any], model: type[Reward]) -> RewardError:
    """Pydantic's errors as one message naming the reward, each option at fault and what it takes."""
    kind, name = model._type_name(), spec.get("name")
    name = name if isinstance(name, str) and name.strip() else kind
    return _failure(name, kind)("; ".join(_problem(detail, model) for detail in error.errors()))


def _problem(detail: ErrorDetails, model: type[Reward]) -> str:
    loc = detail["loc"]
    option = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
    if detail["type"] == "missing":
        about = model.model_fields[str(loc[0])].description or ""
        return f"needs {option}" + (f": {about[:1].lower()}{about[1:].rstrip('.')}" if about else "")
    if detail["type"] == "extra_forbidden":
        takes = ", ".join(k for k in model.model_fields if k != "type")
        return f"does not take {option}; it takes {takes}"
    inner = (detail.get("ctx") or {}).get("error")
    if detail["type"] == "value_error" and inner is not None:  # a type's own check: its message says what it got
        return f"{option}: {inner}" if option else str(inner)
    return f"{option} = {detail['input']!r}: {detail['msg']}" if option else detail["msg"]


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
