"""The turns of a feedback record: chat messages as the store keeps them, tool turns included.

A chat that runs the pipeline's tools (infer/chat.py) has, before a reply, assistant turns that call tools
({"role": "assistant", "content": ..., "tool_calls": [...]}) and tool turns with the results ({"role": "tool",
"content": ..., "name": ...}). They are kept in the record's turns, so the rows retrained from it (feedback_rows.py)
show the model the calls and results it answered after, as the SFT traces do. The store keeps a message's
role and content in their own columns and these extra keys as one JSON text (`extras`, `with_extras`).
"""

from __future__ import annotations

import json
from typing import Any

from .conversations import ROLES, tool_call
from .errors import DataError

TOOL_KEYS = ("name", "tool_call_id")  # what a tool turn may carry besides its content


class FeedbackError(ValueError):
    """Feedback that cannot be recorded (bad verdict, empty edit, malformed turns, a message too long)."""


def clean_messages(turns: Any) -> list[dict]:
    """Turns as clean chat messages (JSON text is parsed): role and content, an assistant turn's tool_calls
    (each {"type": "function", "function": {"name", "arguments": {...}}}), a tool turn's name and tool_call_id.
    FeedbackError when malformed, a tool turn that follows no call included (it would not render)."""
    if isinstance(turns, (str, bytes)):
        try:
            turns = json.loads(turns)
        except ValueError:
            raise FeedbackError(f"turns are not JSON: {turns!r:.200}") from None
    if not isinstance(turns, (list, tuple)) or not turns:
        raise FeedbackError(f"turns must be a non-empty list of chat messages, got {turns!r:.200}")
    clean: list[dict] = []
    for i, message in enumerate(turns):
        if not isinstance(message, dict) or message.get("role") not in ROLES or "content" not in message:
            raise FeedbackError(
                f"a chat message must be a dict with a role in {ROLES} and a content, got {message!r:.200}"
            )
        content = message["content"]
        out = {"role": message["role"], "content": "" if content is None else str(content)}
        calls = message.get("tool_calls")
        if calls:
            if out["role"] != "assistant" or not isinstance(calls, (list, tuple)):
                raise FeedbackError(f"turn {i}: only an assistant turn calls tools, as a list of calls")
            try:
                out["tool_calls"] = [tool_call(c, f"turn {i}, tool_calls[{j}]") for j, c in enumerate(calls)]
            except DataError as exc:
                raise FeedbackError(str(exc)) from None
        if out["role"] == "tool":
            if not clean or not (clean[-1].get("tool_calls") or clean[-1]["role"] == "tool"):
                raise FeedbackError(f"turn {i}: a tool turn must follow an assistant turn that calls tools")
            out.update({k: str(message[k]) for k in TOOL_KEYS if message.get(k) is not None})
        clean.append(out)
    return clean


def check_turns(turns: Any) -> list[dict]:
    """The turns before a reply as clean messages; they must include a user turn."""
    clean = clean_messages(turns)
    if not any(m["role"] == "user" for m in clean):
        raise FeedbackError("turns must include a user turn")
    return clean


def extras(message: dict) -> str | None:
    """A clean message's keys beyond role and content as JSON text (sorted keys: the same message gives the
    same text, so the store finds it again); None for a plain message."""
    rest = {k: v for k, v in message.items() if k not in ("role", "content")}
    return json.dumps(rest, ensure_ascii=False, sort_keys=True) if rest else None


def with_extras(role: str, content: str, extra: str | None) -> dict:
    """A stored message back as a chat message."""
    return {"role": role, "content": content, **(json.loads(extra) if extra else {})}
