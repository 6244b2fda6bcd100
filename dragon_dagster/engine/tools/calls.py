"""Tool calls in a reply: parsed out of the fallback format, and checked against the declared tools' schemas.

The fallback format (template.py) writes each call as a JSON object inside <tool_call></tool_call>, after the
reply's text:

    Let me look that up.
    <tool_call>
    {"name": "weather", "arguments": {"city": "Paris"}}
    </tool_call>

`parse_calls` returns the text outside the blocks, the calls that parsed, and one problem per block that did not
(not JSON, no name, arguments not an object, a block never closed). `reply_calls` does the same for a reply given
as chat messages (TRL's conversational completions), reading structured `tool_calls` where a message has them.

`validate_call` checks a call against the schemas (`Toolset.schemas`, or the list of {"type": "function",
"function": {...}} a chat template takes) with the `jsonschema` package: a declared tool, its required
arguments, their JSON types and enums. A key the schema does not name is a problem unless the schema says
`additionalProperties` allows it: a Python tool takes keyword arguments and a command tool reads declared
inputs, so an unknown key is the model inventing one (transformers' get_json_schema never writes
additionalProperties, hence this default).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from jsonschema import Draft202012Validator

CALL_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
OPEN_TAG = "<tool_call>"


@dataclass(frozen=True)
class ToolCall:
    """One call: the tool's name and its arguments (a JSON object)."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)

    def as_message_call(self) -> dict[str, Any]:
        """The call as an assistant message's `tool_calls` entry (what chat templates and TRL take)."""
        return {"type": "function", "function": {"name": self.name, "arguments": dict(self.arguments)}}


def parse_calls(reply: str) -> tuple[str, list[ToolCall], list[str]]:
    """(text outside the call blocks, the calls that parsed in order, a problem for each block that did not)."""
    calls: list[ToolCall] = []
    problems: list[str] = []
    pieces: list[str] = []
    position = 0
    for number, match in enumerate(CALL_BLOCK.finditer(reply), start=1):
        pieces.append(reply[position : match.start()])
        position = match.end()
        call, problem = _parse_block(match.group(1))
        if call is not None:
            calls.append(call)
        else:
            problems.append(f"call {number}: {problem}")
    rest = reply[position:]
    if OPEN_TAG in rest:  # a block opened and never closed: the reply was cut off or the model lost the format
        pieces.append(rest[: rest.index(OPEN_TAG)])
        problems.append(f"call {len(calls) + len(problems) + 1}: <tool_call> is never closed")
    else:
        pieces.append(rest)
    return "".join(pieces).strip(), calls, problems


def reply_calls(reply: str | Mapping | Iterable[Mapping]) -> tuple[list[ToolCall], list[str]]:
    """The calls in a reply and the problems parsing them: a text, one assistant message, or a list of chat
    messages (every assistant message's structured `tool_calls`, else the blocks in its content)."""
    if isinstance(reply, str):
        _, calls, problems = parse_calls(reply)
        return calls, problems
    messages = [reply] if isinstance(reply, Mapping) else list(reply)
    calls, problems = [], []
    for message in messages:
        if message.get("role", "assistant") != "assistant":
            continue
        structured = message.get("tool_calls") or []
        for entry in structured:
            call, problem = _from_message_call(entry)
            if call is not None:
                calls.append(call)
            else:
                problems.append(f"call {len(calls) + len(problems) + 1}: {problem}")
        content = message.get("content")
        if not structured and isinstance(content, str):
            _, found, trouble = parse_calls(content)
            calls += found
            problems += trouble
    return calls, problems


def validate_call(call: ToolCall, schemas: Any) -> list[str]:
    """What is wrong with call against the declared tools (a Toolset or a list of chat-template schemas); empty
    when it is a declared tool with arguments its schema accepts."""
    declared = _functions(schemas)
    function = declared.get(call.name)
    if function is None:
        return [f"{call.name!r} is not a declared tool (tools: {', '.join(sorted(declared)) or 'none'})"]
    return [f"tool {call.name!r}: {p}" for p in validate_arguments(function.get("parameters") or {}, call.arguments)]


def validate_arguments(parameters: Mapping[str, Any], arguments: Any) -> list[str]:
    """What is wrong with arguments against a tool's parameters schema; unknown keys are problems unless the
    schema allows additional properties (see the module's docstring)."""
    schema = dict(parameters) or {"type": "object", "properties": {}}
    schema.setdefault("additionalProperties", False)
    validator = Draft202012Validator(schema)
    problems = []
    for error in sorted(validator.iter_errors(arguments), key=lambda e: (list(e.absolute_path), e.message)):
        where = "".join(f"[{p!r}]" for p in error.absolute_path)
        problems.append(f"arguments{where}: {error.message}")
    return problems


def _functions(schemas: Any) -> dict[str, dict[str, Any]]:
    schemas = getattr(schemas, "schemas", schemas)  # a Toolset, or the schema list itself
    out = {}
    for schema in schemas:
        function = schema.get("function", schema)  # {"type": "function", "function": {...}} or the inner object
        out[function["name"]] = function
    return out


def _parse_block(body: str) -> tuple[ToolCall | None, str]:
    try:
        data = json.loads(body)
    except json.JSONDecodeError as e:
        return None, f"not valid JSON ({e})"
    if not isinstance(data, dict):
        return None, f"a JSON {type(data).__name__}, not an object with name and arguments"
    return _call(data.get("name"), data.get("arguments"), "arguments" in data)


def _from_message_call(entry: Any) -> tuple[ToolCall | None, str]:
    if not isinstance(entry, Mapping):
        return None, f"a {type(entry).__name__}, not a call"
    function = entry.get("function", entry)
    if not isinstance(function, Mapping):
        return None, "its function is not an object"
    return _call(function.get("name"), function.get("arguments"), "arguments" in function)


def _call(name: Any, arguments: Any, has_arguments: bool) -> tuple[ToolCall | None, str]:
    if not isinstance(name, str) or not name:
        return None, "no tool name (a string under 'name')"
    if not has_arguments:
        return None, f"tool {name!r}: no 'arguments' object"
    if isinstance(arguments, str):  # some models and servers send the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as e:
            return None, f"tool {name!r}: arguments are not valid JSON ({e})"
    if not isinstance(arguments, dict):
        return None, f"tool {name!r}: arguments are a JSON {type(arguments).__name__}, not an object"
    return ToolCall(name, arguments), ""
