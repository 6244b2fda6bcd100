"""The base of every reward type: the fields all share, how a spec is checked, and the helpers the types use.

A reward type is a pydantic model with `extra="forbid"` and a `type` literal, so a JSON schema of a list of
RewardSpec lists each type's options and a misspelled one is refused. The checks themselves run in one
`mode="before"` validator on the raw mapping, in the order and with the words dragon_reward() in R uses, so a
YAML mistake reads the same whether it is found by `Reward.from_dict` or inside a pipeline stage's model.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, WithJsonSchema, model_validator

# The validation context key Reward.from_dict sets: a custom reward's file is then resolved against its value (a
# base directory; None: the working directory) and must exist. Without it (a reward validated as part of a bigger
# model, such as a pipeline stage whose YAML names a file relative to its folder) the file is kept as written.
FILES_FROM = "dragon_reward_files_from"


class RewardError(ValueError):
    """A reward is misconfigured, cannot score a row, or does not fit the dataset."""


Fail = Callable[[str], RewardError]
# Words or keys: a non-empty list of non-empty strings, where a lone string is one item (the check makes it a list).
Strings = Annotated[
    list[str],
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
    weight: float = Field(1.0, ge=0, allow_inf_nan=False, description="Its weight in the set's weighted sum.")
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

    # -- validation (mirrors dragon_reward() in R) --

    @model_validator(mode="before")
    @classmethod
    def _validate_spec(cls, data: Any, info: ValidationInfo) -> Any:
        if not isinstance(data, Mapping):
            return data  # a model instance, or something pydantic refuses by itself
        kind = cls._type_name()
        if kind is None:
            raise RewardError(
                "Reward is the base of the reward types; build one with Reward.from_dict(spec) or "
                "parse_reward(spec), or validate a RewardSpec"
            )
        spec = dict(data)
        if spec.setdefault("type", kind) != kind:
            return spec  # pydantic names the type this model expects
        allowed = {"type", "weight", "name", *cls.options()}
        extra = sorted(map(str, set(spec) - allowed))
        if extra:  # checked here too (not only by extra="forbid") for a message that lists what the type takes
            raise RewardError(
                f"reward {spec.get('name', kind)!r} ({kind}) does not take {', '.join(extra)}; "
                f"it takes {', '.join(sorted(allowed - {'type'}))}"
            )
        for key, field in cls.model_fields.items():
            if key not in spec:  # a missing required option is None here, so its check names it
                spec[key] = None if field.is_required() else field.get_default(call_default_factory=True)
        if spec["name"] is None:
            spec["name"] = kind
        if not isinstance(spec["name"], str) or not spec["name"].strip():
            raise RewardError(f"reward {kind!r}: name must be a non-empty string")
        fail = _failure(spec["name"], kind)
        spec["weight"] = _number(spec["weight"], "weight", fail, minimum=0)
        cls._check(spec, fail, info.context or {})
        return spec

    @classmethod
    def _check(cls, spec: dict[str, Any], fail: Fail, context: Mapping[str, Any]) -> None:
        """Check and normalize the type's options in spec (all present, defaults filled in); raise fail(...)."""

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

    @classmethod
    def from_dict(cls, spec: Mapping[str, Any], base_dir: str | Path | None = None) -> Reward:
        """A reward from a plain mapping (YAML, config.json), as the model of its type.

        A custom reward's relative `file` is resolved against base_dir (else the working directory) and must exist.
        """
        from . import REWARD_TYPES  # the package lists the types, which import this module

        if not isinstance(spec, Mapping) or "type" not in spec:
            raise RewardError(f"a reward spec must be a mapping with a type, got {spec!r}")
        kind = spec["type"]
        model = REWARD_TYPES.get(kind) if isinstance(kind, str) else None
        if model is None:
            raise RewardError(f"unknown reward type {kind!r}; known: {', '.join(REWARD_TYPES)}")
        if not issubclass(model, cls):
            raise RewardError(f"{cls.__name__} cannot be built from a {kind!r} reward spec")
        try:
            return model.model_validate(spec, context={FILES_FROM: base_dir})
        except ValidationError as e:
            error = _reward_error(e, spec, kind)
        raise error from error.__cause__  # outside the except: no pydantic traceback around the reward's message

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


def _reward_error(error: ValidationError, spec: Mapping[str, Any], kind: str) -> RewardError:
    """The reward's own message out of pydantic's wrapping; pydantic's words only for what it found itself."""
    details = error.errors()
    for detail in details:
        inner = (detail.get("ctx") or {}).get("error")
        if isinstance(inner, RewardError):
            return inner
    problems = "; ".join(f"{'.'.join(map(str, d['loc'])) or 'spec'}: {d['msg']}" for d in details)
    return RewardError(f"reward {spec.get('name') or kind!r} ({kind}): {problems}")


# -- checks shared by the types: each raises fail(problem), which names the reward and its type --


def _failure(name: Any, kind: str) -> Fail:
    return lambda problem: RewardError(f"reward {name!r} ({kind}): {problem}")


def _number(value: Any, what: str, fail: Fail, minimum: float | None = None, integer: bool = False) -> Any:
    # No coercion: YAML 1.1 reads 1e-3 as a string, and a string or a boolean is refused rather than guessed at.
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (integer and not float(value).is_integer()) or (minimum is not None and value < minimum):
        kind = "a whole number" if integer else "a number"
        raise fail(f"{what} must be {kind}" + (f" >= {minimum}" if minimum is not None else "") + f", got {value!r}")
    return int(value) if integer else float(value)


def _strings(value: Any, what: str, fail: Fail) -> list[str]:
    # A lone string means one item, as a length-1 character vector does in R.
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not items or not all(isinstance(s, str) and s for s in items):
        raise fail(f"needs {what}: a non-empty list of non-empty strings, got {value!r}")
    return list(items)


def _choice(value: Any, what: str, choices: tuple[str, ...], fail: Fail) -> str:
    if value not in choices:
        raise fail(f"{what} must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


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
