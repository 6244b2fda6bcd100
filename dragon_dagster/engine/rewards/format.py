"""Rewards on the shape of a completion, no reference needed: regex, json, length, keyword (format family)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import Field, PrivateAttr

from ..text.matchers import unfence
from .base import Fail, Reward, Strings, _choice, _number, _strings


class _FormatReward(Reward):
    family: ClassVar[Literal["accuracy", "format"]] = "format"


class RegexReward(_FormatReward):
    """1 when the pattern matches somewhere in the completion (re.search; anchor it with ^ or $)."""

    type: Literal["regex"] = "regex"
    pattern: str = Field(min_length=1, description="A Python regular expression.")
    case_sensitive: bool = Field(False, description="Match case exactly; by default case is ignored.")
    _compiled: re.Pattern | None = PrivateAttr(None)

    @classmethod
    def _check(cls, spec: dict[str, Any], fail: Fail, context: Mapping[str, Any]) -> None:
        if not isinstance(spec["pattern"], str) or not spec["pattern"]:
            raise fail("needs a pattern")
        if not isinstance(spec["case_sensitive"], bool):
            raise fail(f"case_sensitive must be true or false, got {spec['case_sensitive']!r}")
        try:
            _compile(spec["pattern"], spec["case_sensitive"])
        except re.error as e:
            raise fail(f"pattern {spec['pattern']!r} is not a valid regular expression: {e}") from e

    def model_post_init(self, context: Any) -> None:
        self._compiled = _compile(self.pattern, self.case_sensitive)

    def score(self, completion: str, reference: Any = None, prompt: str = "", row: Mapping | None = None) -> float:
        return float(self._compiled.search(completion) is not None)


class JsonReward(_FormatReward):
    """1 for valid JSON (a ``` fenced block counts); with keys, the share of them a JSON object has."""

    type: Literal["json"] = "json"
    keys: Strings | None = Field(None, description="Keys the JSON object should have; one key may be a plain string.")

    @classmethod
    def _check(cls, spec: dict[str, Any], fail: Fail, context: Mapping[str, Any]) -> None:
        if spec["keys"] is not None:
            spec["keys"] = _strings(spec["keys"], "keys", fail)

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
    min_chars: int | None = Field(None, ge=0, description="The fewest characters that score 1.")
    max_chars: int | None = Field(None, ge=1, description="The most characters that score 1.")

    @classmethod
    def _check(cls, spec: dict[str, Any], fail: Fail, context: Mapping[str, Any]) -> None:
        if spec["min_chars"] is None and spec["max_chars"] is None:
            raise fail("needs min_chars or max_chars")
        if spec["min_chars"] is not None:
            spec["min_chars"] = _number(spec["min_chars"], "min_chars", fail, minimum=0, integer=True)
        if spec["max_chars"] is not None:
            spec["max_chars"] = _number(spec["max_chars"], "max_chars", fail, minimum=1, integer=True)
        low, high = spec["min_chars"], spec["max_chars"]
        if None not in (low, high) and low > high:
            raise fail(f"min_chars ({low}) is above max_chars ({high})")

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

    @classmethod
    def _check(cls, spec: dict[str, Any], fail: Fail, context: Mapping[str, Any]) -> None:
        spec["words"] = _strings(spec["words"], "words", fail)
        spec["mode"] = _choice(spec["mode"], "mode", ("any", "all"), fail)

    def score(self, completion: str, reference: Any = None, prompt: str = "", row: Mapping | None = None) -> float:
        found = [re.search(rf"(?<!\w){re.escape(w)}(?!\w)", completion, re.IGNORECASE) is not None for w in self.words]
        return float(any(found) if self.mode == "any" else all(found))


def _compile(pattern: str, case_sensitive: bool) -> re.Pattern:
    return re.compile(pattern, 0 if case_sensitive else re.IGNORECASE)
