"""Tool-call scores, one number per reply, for the evaluation and as GRPO rewards (the style of TRL's trl/rewards:
plain functions, None where a reply is not scored, which TRL reads as "not applicable" for that completion).

A reply is a text in the fallback format, one assistant message, or a list of chat messages (tools.calls.reply_calls
reads each). The reference is the call a held-out conversation expects: `expected_call(conversation)` takes the
first tool call of its first assistant turn that calls one.

- `tool_call_valid(reply, schemas)`: 1.0 when the reply calls at least one tool and every call parses and
  validates against the declared schemas; 0.0 when any call is malformed or invalid; None when it calls none.
- `tool_name_match(reply, reference)`: whether the reply's first call names the reference's tool.
- `tool_arguments_match(reply, reference)`: of the keys in either the reference's arguments or the reply's first
  call's (same tool), the share whose values are equal as JSON (1 and 1.0 equal, true and 1 not); 0.0 for another
  tool or no call; 1.0 when both take no arguments.
The two reference scores are None when there is no reference (the conversation expects no call).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .calls import ToolCall, parse_calls, reply_calls, validate_call

Reply = str | Mapping | Iterable[Mapping]


def expected_call(conversation: Iterable[Mapping]) -> ToolCall | None:
    """The first tool call of the first assistant turn that makes one (structured `tool_calls`, else
    <tool_call> blocks in its content); None when no assistant turn calls a tool, or its call does not parse."""
    for message in conversation:
        if message.get("role") != "assistant":
            continue
        if message.get("tool_calls"):
            calls, _ = reply_calls([message])
            return calls[0] if calls else None
        content = message.get("content")
        if isinstance(content, str):
            _, calls, problems = parse_calls(content)
            if calls or problems:
                return calls[0] if calls else None
    return None


def tool_call_valid(reply: Reply, schemas: Any) -> float | None:
    """1.0 if the reply's calls all parse and validate against schemas (a Toolset or chat-template schemas),
    0.0 if any does not, None if the reply calls no tool."""
    calls, problems = reply_calls(reply)
    if not calls and not problems:
        return None
    if problems:
        return 0.0
    return float(all(not validate_call(call, schemas) for call in calls))


def tool_name_match(reply: Reply, reference: ToolCall | None) -> float | None:
    """1.0 if the reply's first call is to the reference's tool, 0.0 if to another or none; None without a
    reference."""
    if reference is None:
        return None
    first = _first_call(reply)
    return float(first is not None and first.name == reference.name)


def tool_arguments_match(reply: Reply, reference: ToolCall | None) -> float | None:
    """The share of argument keys (the reference's and the reply's first call's together) with JSON-equal
    values; 0.0 if the first call is to another tool or there is none; None without a reference."""
    if reference is None:
        return None
    first = _first_call(reply)
    if first is None or first.name != reference.name:
        return 0.0
    keys = set(reference.arguments) | set(first.arguments)
    if not keys:
        return 1.0
    same = sum(
        key in reference.arguments
        and key in first.arguments
        and json_equal(reference.arguments[key], first.arguments[key])
        for key in keys
    )
    return same / len(keys)


def json_equal(a: Any, b: Any) -> bool:
    """Equal as JSON values: numbers by value (1 == 1.0), but a boolean is never a number; objects by keys."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def _first_call(reply: Reply) -> ToolCall | None:
    calls, _ = reply_calls(reply)
    return calls[0] if calls else None
