"""The base of every reward type: the fields all share, how a spec is parsed, and the helpers the types use.

A reward type is a pydantic model with `extra="forbid"` and a `type` literal, so a JSON schema of a list of
RewardSpec lists each type's options and a misspelled one is refused. Pydantic parses a spec: each option's type
and range is its field's, a check that spans options is the type's `model_validator(mode="after")`, and
spec.py's `parse_reward` words pydantic's errors as one message naming the reward, the option and what it takes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, field_validator, model_validator

# The validation context key parse_reward sets: a custom reward's file is then resolved against its value (a
# base directory; None: the working directory) and must exist. Without it (a reward validated as part of a bigger
# model, such as a pipeline stage whose YAML names a file relative to its folder) the file is kept as written.
FILES_FROM = "dragon_reward_files_from"


class RewardError(ValueError):
    """A reward is misconfigured, cannot score a row, or does not fit the dataset."""


def _not_a_boolean(value: Any) -> Any:
    # Pydantic reads true as 1; in a reward's YAML a `yes` where a number belongs is a slip, not a weight of 1.
    if isinstance(value, bool):
        raise ValueError(f"must be a number, not {str(value).lower()}")
    return value


def _one_is_a_list(value: Any) -> Any:
    # A lone string means one item, as a length-1 character vector does in R.
    return [value] if isinstance(value, str) else value


# A finite number (YAML 1.1 reads 1e-3 as text: pydantic parses it); a boolean is refused.
Number = Annotated[float, BeforeValidator(_not_a_boolean), Field(allow_inf_nan=False)]
# A whole number: 3 or 3.0, not 2.5; a boolean is refused.
Whole = Annotated[int, BeforeValidator(_not_a_boolean)]
# Words or keys: a non-empty list of non-empty strings, where a lone string is one item.
Strings = Annotated[
    list[Annotated[str, Field(min_length=1)]],
    BeforeValidator(_one_is_a_list),
    Field(min_length=1),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1},
                {"type": "string", "minLength": 1},
            ]
        }
    ),
]


class Reward(BaseModel):
    """One verifiable reward. Each type is a subclass taking only its own options (see REWARD_TYPES)."""

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    type: str = Field(description="The reward type, which decides the options it takes.")
    weight: Number = Field(1.0, ge=0, description="Its weight in the set's weighted sum.")
    name: str | None = Field(
        None, description="Labels its progress column (reward_<name>) and its score; defaults to the type."
    )

    # Whether the type compares with the row's reference, and how checks and reports read it: accuracy-like
    # rewards score right or wrong (their mean is a share); format-like ones shape the reply, and rising while
    # accuracy falls is the mark of reward hacking.
    needs_reference: ClassVar[bool] = False
    family: ClassVar[Literal["accuracy", "format", "learned"]]
    # Whether the type scores a batch at once (score_many): a model's forward pass over many replies.
    batched: ClassVar[bool] = False

    @model_validator(mode="before")
    @classmethod
    def _a_type_of_reward(cls, data: Any) -> Any:
        if cls._type_name() is None:
            raise ValueError(
                "Reward is the base of the reward types; build one with parse_reward(spec) or validate a RewardSpec"
            )
        return data

    @field_validator("name")
    @classmethod
    def _named(cls, name: str | None) -> str | None:
        if name is not None and not name.strip():
            raise ValueError("must be a non-empty string; leave it out to name the reward after its type")
        return name

    @model_validator(mode="after")
    def _default_name(self) -> Reward:
        if self.name is None:
            self.name = self.type
        return self

    @classmethod
    def _type_name(cls) -> str | None:
        default = cls.model_fields["type"].default
        return default if isinstance(default, str) else None

    @classmethod
    def options(cls) -> tuple[str, ...]:
        """The options this type takes besides type, weight and name, in the order of its spec."""
        return tuple(k for k in cls.model_fields if k not in Reward.model_fields)

    def _fail(self, problem: str) -> RewardError:
        return _failure(self.name, self.type)(problem)

    # -- the serializable spec --

    def to_dict(self, relative_to: str | Path | None = None) -> dict[str, Any]:
        """The spec as plain data: type, weight, name and every option of the type (None when unset)."""
        out = {"type": self.type, "weight": self.weight, "name": self.name}
        out.update({k: getattr(self, k) for k in self.options()})
        return out

    def localize(self, run_dir: str | Path) -> Reward:
        """A reward whose files live in run_dir (named relative to it), so the run is self-contained and can move;
        only custom rewards have one."""
        return self

    def resolved(self, base_dir: str | Path | None = None) -> Reward:
        """This reward with its files found: a relative path read from base_dir (the folder of the YAML that
        named it, or the run directory it was localized into), checked to exist; only custom rewards have one."""
        return self

    # -- scoring --

    def score(self, completion: str, reference: Any = None, prompt: str = "", row: Mapping | None = None) -> float:
        """Score one completion between 0 and 1. Raises on a broken row; RewardSet.score decides whether that
        stops the run."""
        raise NotImplementedError(f"{type(self).__name__} does not score")

    def score_many(self, replies: Sequence[str], rows: Sequence[Mapping], grouped: bool = False) -> list[float]:
        """Score a batch (types with batched = True): replies[i] against rows[i]. grouped: the rows are a GRPO
        step's completions, each prompt's group side by side."""
        raise NotImplementedError(f"{type(self).__name__} scores one reply at a time")


def _failure(name: Any, kind: str) -> Callable[[str], RewardError]:
    """A RewardError naming the reward and its type, for a problem with its spec or a row it scores."""
    return lambda problem: RewardError(f"reward {name!r} ({kind}): {problem}")


# -- row helpers --


def _text(value: Any, role: str) -> str:
    """Plain text from a string or chat messages: the last message of `role`, else the last message."""
    if value is None:
        return ""
    if isinstance(value, Mapping):
        value = [value]
    if isinstance(value, (list, tuple)):
        if not value:
            return ""
        message = next((m for m in reversed(value) if isinstance(m, Mapping) and m.get("role") == role), value[-1])
        content = message.get("content", "") if isinstance(message, Mapping) else message
        if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}, ...]
            return "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
        return "" if content is None else str(content)
    return str(value)


def _blank(value: Any) -> bool:
    # pandas turns an empty cell into NaN, which must count as missing rather than the text "nan".
    return value is None or (isinstance(value, float) and math.isnan(value)) or not str(value).strip()


def _some(indices: list[int], limit: int = 5) -> str:
    shown = ", ".join(map(str, indices[:limit]))
    return shown + (", ..." if len(indices) > limit else "")
