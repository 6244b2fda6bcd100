"""A chat's messages as the Chat keeps them: parsed from outside (a transcript, the browser's storage), the
marks a reply carries beside the conversation (stopped, its trace, its rating), and the turns grouped into
exchanges. Framework-free."""

from __future__ import annotations

import re
from typing import Any

from ..data.conversations import ROLES
from ..data.feedback_turns import FeedbackError, clean_messages


class ChatError(ValueError):
    """A chat operation that cannot be done (nothing to rate, undo or regenerate; a bad transcript)."""


def parse_messages(items: Any, where: str = "transcript") -> list[dict]:
    if not isinstance(items, list):
        raise ChatError(f"{where}: expected a list of chat messages, got {type(items).__name__}")
    for i, m in enumerate(items):
        if not isinstance(m, dict) or m.get("role") not in ROLES or "content" not in m:
            raise ChatError(f"{where}: message {i} must be a dict with a role in {ROLES} and a content, got {m!r:.200}")
    if not items:
        return []
    try:  # tool calls in their one form, tool turns only after a call
        return clean_messages(items)
    except FeedbackError as exc:
        raise ChatError(f"{where}: {exc}") from None


# What Chat.messages keeps on a reply that is not part of the conversation: whether it was stopped, its MLflow
# trace, and its rating ({"verdict": "up"|"down", "feedback_id": int|None}: shown on the page, and counted once).
MARKS = ("stopped", "trace_id", "rating")
TRACE_ID = re.compile(r"tr-[0-9a-f]{32}")  # an MLflow 3 trace id, as the tracer returns it


def kept_marks(item: dict) -> dict:
    """The marks of a message that comes back from outside (the browser's storage, a transcript), those that are
    well formed: a trace id of MLflow's form, a rating with an up/down verdict (anything else is dropped)."""
    marks = {}
    if item.get("stopped") is True:
        marks["stopped"] = True
    trace_id = item.get("trace_id")
    if isinstance(trace_id, str) and TRACE_ID.fullmatch(trace_id):
        marks["trace_id"] = trace_id
    rating = item.get("rating")
    if isinstance(rating, dict) and rating.get("verdict") in ("up", "down"):
        feedback_id = rating.get("feedback_id")
        ok = isinstance(feedback_id, int) and not isinstance(feedback_id, bool)
        marks["rating"] = {"verdict": rating["verdict"], "feedback_id": feedback_id if ok else None}
    return marks


def plain(message: dict) -> dict:
    """A message as a chat message: role, content and its tool keys (a reply may carry a "stopped" mark and
    its "trace_id" in Chat.messages, which are not part of the conversation)."""
    return {k: v for k, v in message.items() if k not in MARKS}


def is_answer(message: dict) -> bool:
    """A reply that ends a turn: an assistant turn that calls no tool (those are the ones rated and edited)."""
    return message["role"] == "assistant" and not message.get("tool_calls")


def exchanges(messages: list[dict]) -> list[list[dict]]:
    """Messages grouped into exchanges: each user turn starts one (anything before the first stays with it)."""
    groups: list[list[dict]] = []
    for m in messages:
        if m["role"] == "user" or not groups:
            groups.append([])
        groups[-1].append(m)
    return groups
