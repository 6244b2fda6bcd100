"""The parts of a chat row read back: its last user turn, the reply it teaches, its answer (reply or reference),
whether it calls tools, and the quality counts a dataset's check shows. A row is TRL's conversational
prompt-completion format (row_mapping.py makes them)."""

from __future__ import annotations

import json
from typing import Any


def text_of(value: Any) -> str:
    """A table cell as text: an empty cell (None, pandas' NaN) is ""."""
    if value is None or (isinstance(value, float) and value != value):  # NaN: pandas' empty cell
        return ""
    return str(value)


def user_text(row: dict) -> str:
    """The last user turn of a chat row, for previews and reports."""
    return next(m["content"] for m in reversed(row["prompt"]) if m["role"] == "user")


def reply_text(row: dict) -> str:
    """The reply a row teaches: the completion, or the chosen reply of a pair ("" for a bare prompt)."""
    for column in ("completion", "chosen"):
        if column in row:
            return row[column][-1]["content"]
    return ""


def calls_tools(row: dict) -> bool:
    """Whether the reply a row teaches calls tools (then it may have no text and still be a reply)."""
    for column in ("completion", "chosen"):
        if column in row:
            return bool(row[column][-1].get("tool_calls"))
    return False


def answer_text(row: dict) -> str:
    """The answer a row holds: its reply (a pair's chosen one) or, for a prompt row, its reference. A disliked
    reply is no answer: the same bad reply to many prompts teaches nothing about the held-out ones."""
    if row.get("label") is False:
        return ""
    return reply_text(row) or text_of(row.get("reference"))


def quality(rows: list[dict]) -> dict[str, Any]:
    """Counts an asset check and the metadata show: empty turns (a reply that only calls tools is not empty)
    and duplicate share."""
    empty_prompt = sum(1 for r in rows if not user_text(r).strip())
    empty_reply = sum(
        1 for r in rows if ("completion" in r or "chosen" in r) and not reply_text(r).strip() and not calls_tools(r)
    )
    keys = [json.dumps(r, sort_keys=True) for r in rows]
    duplicate_share = (1 - len(set(keys)) / len(keys)) if keys else 0.0
    return {
        "rows": len(rows),
        "empty_prompts": empty_prompt,
        "empty_replies": empty_reply,
        "duplicate_share": round(duplicate_share, 4),
    }
