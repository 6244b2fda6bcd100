"""Tool calls parsed out of replies in the fallback format, and validated against the declared schemas."""

from __future__ import annotations

import pytest

from dragon_dagster.engine.tools.calls import ToolCall, parse_calls, reply_calls, validate_arguments, validate_call

WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city."},
                "days": {"type": "integer", "description": "How many days."},
                "unit": {"type": "string", "enum": ["C", "F"], "description": "The unit."},
                "hourly": {"type": "boolean", "description": "Hour by hour."},
                "at": {"type": "number", "description": "A latitude."},
                "tags": {"type": "array", "description": "Tags."},
                "extra": {"type": "object", "description": "More."},
            },
            "required": ["city"],
        },
    },
}


def block(body: str) -> str:
    return f"<tool_call>\n{body}\n</tool_call>"


def test_one_call_with_text_before_it():
    reply = 'Let me check.\n<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert parse_calls(reply) == ("Let me check.", [ToolCall("weather", {"city": "Paris"})], [])


def test_several_calls_in_order_and_no_call():
    reply = block('{"name": "a", "arguments": {}}') + "\n" + block('{"name": "b", "arguments": {"x": [1, 2]}}')
    text, calls, problems = parse_calls(reply)
    assert (text, problems) == ("", [])
    assert calls == [ToolCall("a", {}), ToolCall("b", {"x": [1, 2]})]
    assert parse_calls("  Just an answer.  ") == ("Just an answer.", [], [])


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ('{"name": "a", "arguments": {', "call 1: not valid JSON"),
        ('["a", {}]', "call 1: a JSON list, not an object"),
        ('{"arguments": {}}', "call 1: no tool name"),
        ('{"name": "a"}', "call 1: tool 'a': no 'arguments' object"),
        ('{"name": "a", "arguments": [1]}', "call 1: tool 'a': arguments are a JSON list, not an object"),
        ('{"name": "a", "arguments": "{oops"}', "call 1: tool 'a': arguments are not valid JSON"),
    ],
)
def test_a_malformed_block_is_a_problem_and_not_a_call(body, problem):
    text, calls, problems = parse_calls("Hm.\n" + block(body))
    assert text == "Hm." and calls == [] and len(problems) == 1 and problems[0].startswith(problem)


def test_arguments_as_a_json_string_are_read():
    _, calls, _ = parse_calls(block('{"name": "a", "arguments": "{\\"x\\": 1}"}'))
    assert calls == [ToolCall("a", {"x": 1})]


def test_a_good_call_survives_a_bad_one_and_an_unclosed_block_is_a_problem():
    reply = block("nope") + block('{"name": "a", "arguments": {}}') + '<tool_call>\n{"name": "b"'
    text, calls, problems = parse_calls(reply)
    assert calls == [ToolCall("a", {})]
    assert problems[0].startswith("call 1: not valid JSON") and problems[1] == "call 3: <tool_call> is never closed"
    assert text == ""


def test_reply_calls_reads_messages_structured_or_as_text():
    messages = [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "a", "arguments": {"x": 1}}}],
        },
        {"role": "tool", "name": "a", "content": block('{"name": "ignored", "arguments": {}}')},
        {"role": "assistant", "content": "then " + block('{"name": "b", "arguments": {}}')},
        {"role": "assistant", "tool_calls": [{"function": {"name": "c"}}]},
    ]
    calls, problems = reply_calls(messages)
    assert calls == [ToolCall("a", {"x": 1}), ToolCall("b", {})]
    assert problems == ["call 3: tool 'c': no 'arguments' object"]
    assert reply_calls({"role": "assistant", "content": "plain"}) == ([], [])


def test_a_valid_call_has_no_problems():
    call = ToolCall(
        "weather", {"city": "Oslo", "days": 2, "unit": "C", "hourly": False, "at": 59.9, "tags": [], "extra": {}}
    )
    assert validate_call(call, [WEATHER]) == []
    assert validate_call(ToolCall("weather", {"city": "Oslo", "at": 60}), [WEATHER]) == []  # an integer is a number


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ({}, "'city' is a required property"),
        ({"city": "Oslo", "country": "NO"}, "('country' was unexpected)"),
        ({"city": 3}, "arguments['city']: 3 is not of type 'string'"),
        ({"city": "Oslo", "days": 1.5}, "1.5 is not of type 'integer'"),
        ({"city": "Oslo", "days": True}, "True is not of type 'integer'"),
        ({"city": "Oslo", "hourly": "yes"}, "'yes' is not of type 'boolean'"),
        ({"city": "Oslo", "at": "north"}, "'north' is not of type 'number'"),
        ({"city": "Oslo", "tags": "a"}, "'a' is not of type 'array'"),
        ({"city": "Oslo", "extra": []}, "[] is not of type 'object'"),
        ({"city": "Oslo", "unit": "K"}, "'K' is not one of ['C', 'F']"),
    ],
)
def test_arguments_the_schema_refuses(arguments, problem):
    problems = validate_call(ToolCall("weather", arguments), [WEATHER])
    assert len(problems) == 1 and problems[0].startswith("tool 'weather': ") and problem in problems[0]


def test_an_undeclared_tool_and_a_schema_that_allows_more_keys():
    assert validate_call(ToolCall("news", {}), [WEATHER]) == ["'news' is not a declared tool (tools: weather)"]
    open_schema = {"type": "object", "properties": {}, "additionalProperties": True}
    assert validate_arguments(open_schema, {"anything": 1}) == []
    assert validate_arguments(open_schema, [1]) == ["arguments: [1] is not of type 'object'"]
