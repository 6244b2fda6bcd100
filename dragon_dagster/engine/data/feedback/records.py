"""A feedback record as every backend stores and returns it, and the checks a record passes before it is stored:
every backend refuses the same records with the same words (FeedbackError, data/feedback_turns.py).

A record is one feedback event: the conversation's turns before the rated reply, the reply, the verdict ('up',
'down' or 'edit' with the improved text) and which model answered. A single message may hold at most
`MAX_MESSAGE_CHARS` characters; longer ones are refused with the length and the limit.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, NamedTuple, TypedDict

from ..feedback_turns import FeedbackError, check_turns

VERDICTS = ("up", "down", "edit")
MAX_MESSAGE_CHARS = 32_000  # the longest single message (a turn, a reply, an edit) the store accepts
# The stored layout's version, the same in both backends (sqlite.py, postgres.py say what each version added). A
# store cannot be read by code older than its version.
SCHEMA_VERSION = 6


class FeedbackRecord(TypedDict):
    """A stored record as records() returns it. `turns` are chat messages (data/feedback_turns.py); a first-layout
    record whose turns could not be converted has them as stored (parsed when JSON, else the text), for
    data/feedback_rows.py to skip and count."""

    id: int
    conversation_id: str
    turns_id: int | None
    reply: str
    verdict: str
    edited: str | None
    model: str
    created: str
    trace_id: str | None
    turns: Any


class RatingRecord(TypedDict):
    """A record without its turns, as ratings() and first_ratings() return it: what a count by version needs."""

    id: int
    model: str
    verdict: str
    created: str


class CheckedRecord(NamedTuple):
    """A record's values after its checks, as the feedback table stores them (its turns are stored apart)."""

    conversation_id: str
    reply: str
    verdict: str
    edited: str | None
    model: str
    created: str
    trace_id: str | None

    @property
    def revision(self) -> tuple[str, str | None, str, str]:
        """What a rater's revised rating replaces in the record it revises: verdict, edit, model, time."""
        return self.verdict, self.edited, self.model, self.created


def too_long(text: str, limit: int | None = MAX_MESSAGE_CHARS, what: str = "a message") -> str | None:
    """The refusal for text over the limit, naming its length and the limit; None when it fits."""
    if limit is None or len(text) <= limit:
        return None
    return f"{what} is {len(text):,} characters long; the limit is {limit:,} characters per message (MAX_MESSAGE_CHARS)"


def checked_record(
    max_message_chars: int | None,
    conversation_id: str,
    turns: list[dict],
    reply: str,
    verdict: str,
    edited: str | None,
    model: str,
    trace_id: str | None,
) -> tuple[list[dict], CheckedRecord]:
    """(the turns as clean messages, the record's values), or FeedbackError naming what is wrong."""

    def check_length(text: str, what: str) -> None:
        problem = too_long(text, max_message_chars, what)
        if problem:
            raise FeedbackError(problem)

    if verdict not in VERDICTS:
        raise FeedbackError(f"verdict must be one of {VERDICTS}, got {verdict!r}")
    if verdict == "edit":
        if not isinstance(edited, str) or not edited.strip():
            raise FeedbackError("an 'edit' needs the improved reply text (non-empty)")
        check_length(edited, "the edited reply")
    elif edited is not None:
        raise FeedbackError(f"edited text goes with verdict 'edit' only, not {verdict!r}")
    if not isinstance(reply, str):
        raise FeedbackError(f"reply must be text, got {reply!r:.200}")
    check_length(reply, "the reply")
    messages = check_turns(turns)
    for i, m in enumerate(messages):
        check_length(m["content"], f"turn {i} ({m['role']})")
    record = CheckedRecord(
        str(conversation_id),
        reply,
        verdict,
        edited,
        str(model or ""),
        datetime.now(UTC).isoformat(timespec="microseconds"),
        None if trace_id is None else str(trace_id),
    )
    return messages, record
