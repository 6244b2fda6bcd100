"""Rewards that compare a completion with the row's reference answer: exact, contains, numeric (accuracy)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from ..text.matchers import contains, exact, numeric
from .base import Reward, _blank


class _ReferenceReward(Reward):
    """A reward that needs the row's reference; the matchers are those of the evaluation, so both agree."""

    needs_reference: ClassVar[bool] = True
    family: ClassVar[Literal["accuracy", "format"]] = "accuracy"

    def score(self, completion: str, reference: Any = None, prompt: str = "", row: Mapping | None = None) -> float:
        if _blank(reference):
            raise self._fail("this row has no reference to compare with")
        return self._compare(completion, str(reference))

    def _compare(self, completion: str, reference: str) -> float:
        raise NotImplementedError


class ExactReward(_ReferenceReward):
    """1 when the completion equals the reference, ignoring case, runs of spaces and trailing punctuation."""

    type: Literal["exact"] = "exact"

    def _compare(self, completion: str, reference: str) -> float:
        return exact(completion, reference)


class ContainsReward(_ReferenceReward):
    """1 when the completion contains the reference, normalized as for exact."""

    type: Literal["contains"] = "contains"

    def _compare(self, completion: str, reference: str) -> float:
        return contains(completion, reference)


class NumericReward(_ReferenceReward):
    """1 when the last number in the completion equals the reference's ("1/2" equals "0.5", "1,000" is 1000)."""

    type: Literal["numeric"] = "numeric"

    def _compare(self, completion: str, reference: str) -> float:
        return numeric(completion, reference)
