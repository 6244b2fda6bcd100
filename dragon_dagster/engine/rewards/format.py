"""Rewards on the shape of a completion, no reference needed: regex, json, length, keyword (format family)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from ..text.matchers import unfence
from .base import Reward, Strings, Whole


class _FormatReward(Reward):
    family: ClassVar[Literal["accuracy", "format"]] = "format"


class RegexReward(_FormatReward):
    """1 when the pattern matches somewhere in the completion (re.search; anchor it with ^ or $)."""

    type: Literal["regex"] = "regex"
    pattern: str = Field(min_length=1, description="A Python regular expression.")
    case_sensitive: bool = Field(False, description="Match case exactly; by default case is ignored.")
    _compiled: re.Pattern | None = PrivateAttr(None)

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, pattern: str) -> str:
        try:
            re.compile(pattern)
        except re.error as e:
            raise ValueError(f"{pattern!r} is not a valid regular expression: {e}") from e
        return pattern

    def model_post_init(self, context: Any) -> None:
        self._compiled = _compile(self.pattern, self.case_sensitive)

    def score(self, completion: str, reference: Any = None, prompt: str = "", row: Mapping | None = None) -> float:
        return float(self._compiled.search(completion) is not None)


class JsonReward(_FormatReward):
    """1 for valid JSON (a ``` fenced block counts); with keys, the share of them a JSON object has."""

    type: Literal["json"] = "json"
    keys: Strings | None = Field(None, description="Keys the JSON object should have; one key may be a plain string.")

    def score(self, completion: str, reference: Any = None, prompt: str = "", row: Mapping | None = None) -> float:
        try:
            value = json.loads(unfence(completion))
        except (ValueError, RecursionError):  # RecursionError: absurdly deep nesting
            return 0.0
        if not self.keys:
            return 1.0
        # Partial credit per required key gives the policy a gradient towards the full shape.
        return sum(k in value for k in self.keys) / len(self.keys) if isinstance(value, dict) else 0.0


class LengthReward(_FormatReward):
    """1 within [min_chars, max_chars]; falls linearly to 0 at 0 chars and at twice max_chars."""

    type: Literal["length"] = "length"
    min_chars: Whole | None = Field(None, ge=0, description="The fewest characters that score 1.")
    max_chars: Whole | None = Field(None, ge=1, description="The most characters that score 1.")

    @model_validator(mode="after")
    def _a_range(self) -> LengthReward:
        if self.min_chars is None and self.max_chars is None:
            raise ValueError("needs min_chars or max_chars")
        if None not in (self.min_chars, self.max_chars) and self.min_chars > self.max_chars:
            raise ValueError(f"min_chars ({self.min_chars}) is above max_chars ({self.max_chars})")
        return self

    def score(self, completion: str, reference: Any = None, prompt: str = "", row: Mapping | None = None) -> float:
        n = len(completion)
        if self.min_chars and n < self.min_chars:
            return n / self.min_chars
        if self.max_chars is not None and n > self.max_chars:
            return max(0.0, 1.0 - (n - self.max_chars) / self.max_chars)
        return 1.0


class KeywordReward(_FormatReward):
    """1 when any (or all) of the words occur as whole words, ignoring case: "cat" is not in "category"."""

    type: Literal["keyword"] = "keyword"
    words: Strings = Field(description="The words to look for; one word may be a plain string.")
    mode: Literal["any", "all"] = Field("any", description="Whether any word is enough or all must occur.")

    def score(self, completion: str, reference: Any = None, prompt: str = "", row: Mapping | None = None) -> float:
        found = [re.search(rf"(?<!\w){re.escape(w)}(?!\w)", completion, re.IGNORECASE) is not None for w in self.words]
        return float(any(found) if self.mode == "any" else all(found))


def _compile(pattern: str, case_sensitive: bool) -> re.Pattern:
    return re.compile(pattern, 0 if case_sensitive else re.IGNORECASE)
