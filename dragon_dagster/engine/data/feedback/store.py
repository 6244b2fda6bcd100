"""The feedback store as its users call it: chats and `dragon serve` record ratings, retraining and the sensor read
records by id range. Two backends keep it (sqlite.py, postgres.py); opener.py gives the one a setting names.

Ids only grow and have no gaps, and a record is readable once its id is returned, so "records up to the highest
id seen, then after it" reads each record exactly once: a watermark is all an incremental reader keeps.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from .records import FeedbackRecord, RatingRecord


class FeedbackSource(Protocol):
    """Records read by id range: the store, or the assessments on an experiment's traces (data/trace_feedback.py)."""

    def max_id(self) -> int:
        """The highest id committed (0 when empty): a watermark for incremental reads."""
        ...

    def count(self, after_id: int = 0) -> int:
        """How many records have an id above after_id."""
        ...

    def records(self, after_id: int = 0, up_to_id: int | None = None) -> list[FeedbackRecord]:
        """Records with after_id < id <= up_to_id, in id order, with their turns."""
        ...


class FeedbackStore(FeedbackSource, Protocol):
    """Append-only chat feedback: no delete, and one update only (a rater revising the rating stored under its
    key)."""

    @property
    def where(self) -> str:
        """Where the records are, for people (never a password)."""
        ...

    def check(self) -> str:
        """Reach the store and create or upgrade its layout now; where the records are. Raises the clear error
        (naming the setting) when it cannot."""
        ...

    def record(
        self,
        conversation_id: str,
        turns: list[dict],
        reply: str,
        verdict: str,
        edited: str | None = None,
        model: str = "",
        trace_id: str | None = None,
        key: str | None = None,
        replace: bool = False,
    ) -> int:
        """Append one feedback event and return its id once it is durably committed (FeedbackError naming what
        is wrong with a record refused). `key`: the record's own key (a write retried after its acknowledgement
        was lost is stored once); `replace`: a record stored under `key` takes this one's verdict, edit, model
        and time."""
        ...

    def pages(
        self, after_id: int = 0, up_to_id: int | None = None, size: int | None = None
    ) -> Iterator[list[FeedbackRecord]]:
        """records(after_id, up_to_id) a page of at most `size` records at a time (keyset pagination by id), for a
        reader that need not hold every record at once."""
        ...

    def ratings(self, after_id: int = 0) -> list[RatingRecord]:
        """Records after after_id without their turns, in id order."""
        ...

    def verdict_counts(self, up_to_id: int) -> dict[str, tuple[int, int]]:
        """{model: (liked, rated)} of the records up to up_to_id, counted by the database."""
        ...

    def first_ratings(self, model: str, after_id: int, limit: int) -> list[RatingRecord]:
        """The first `limit` ratings of one model after after_id, in id order."""
        ...
