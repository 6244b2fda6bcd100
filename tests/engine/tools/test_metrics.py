"""Tool-call scores per reply: validity, the right tool, the right arguments, and the reference they need."""

from __future__ import annotations

import pytest

from dragon_dagster.engine.tools.calls import ToolCall
from dragon_dagster.engine.tools.metrics import (
    expected_call,
    json_equal,
    tool_arguments_match,
    tool_call_valid,
    tool_name_match,
)

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Adds.",
        "parameters": {
            "type": "object",
            "properties": {
                "a": {"type": "integer", "description": "A."},
                "b": {"type": "integer", "description": "B."},
            },
            "required": ["a", "b"],
        },
    },
}


def call(name: str, arguments: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


def test_validity():
    assert tool_call_valid(call("add", '{"a": 1, "b": 2}'), [ADD]) == 1.0
    assert tool_call_valid(call("add", '{"a": 1, "b": 2}') + call("add", '{"a": 1}'), [ADD]) == 0.0  # one invalid
    assert tool_call_valid(call("sub", '{"a": 1, "b": 2}'), [ADD]) == 0.0  # undeclared
    assert tool_call_valid("<tool_call>\n{broken\n</tool_call>", [ADD]) == 0.0  # does not parse
    assert tool_call_valid("The answer is 3.", [ADD]) is None  # no call: not scored


def test_validity_takes_a_toolset():
    from dragon_dagster.engine.tools.declare import Tools, Toolset

    toolset = Toolset.from_settings(Tools(schemas=[ADD["function"]]))
    assert tool_call_valid(call("add", '{"a": 1, "b": 2}'), toolset) == 1.0
    assert tool_call_valid(call("add", '{"a": "1", "b": 2}'), toolset) == 0.0


def test_expected_call_is_the_first_call_of_a_conversation():
    conversation = [
        {"role": "user", "content": "1 + 2?"},
        {"role": "assistant", "content": "Sure."},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}},
                {"type": "function", "function": {"name": "add", "arguments": {"a": 9, "b": 9}}},
            ],
        },
        {"role": "tool", "name": "add", "content": "3"},
        {"role": "assistant", "content": "3"},
    ]
    assert expected_call(conversation) == ToolCall("add", {"a": 1, "b": 2})
    as_text = [
        {"role": "user", "content": "?"},
        {"role": "assistant", "content": "x " + call("add", '{"a": 5, "b": 6}')},
    ]
    assert expected_call(as_text) == ToolCall("add", {"a": 5, "b": 6})
    assert expected_call([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]) is None


def test_name_match():
    reference = ToolCall("add", {"a": 1, "b": 2})
    assert tool_name_match(call("add", "{}"), reference) == 1.0
    assert tool_name_match(call("sub", "{}") + call("add", "{}"), reference) == 0.0  # the first call counts
    assert tool_name_match("no call", reference) == 0.0
    assert tool_name_match(call("add", "{}"), None) is None


def test_arguments_match_is_the_share_of_equal_keys():
    reference = ToolCall("add", {"a": 1, "b": 2})
    assert tool_arguments_match(call("add", '{"a": 1.0, "b": 2}'), reference) == 1.0
    assert tool_arguments_match(call("add", '{"a": 1, "b": 3}'), reference) == 0.5
    assert tool_arguments_match(call("add", '{"a": 1}'), reference) == 0.5  # b missing
    assert tool_arguments_match(call("add", '{"a": 1, "b": 2, "c": 0}'), reference) == pytest.approx(2 / 3)  # extra
    assert tool_arguments_match(call("sub", '{"a": 1, "b": 2}'), reference) == 0.0
    assert tool_arguments_match("no call", reference) == 0.0
    assert tool_arguments_match(call("now", "{}"), ToolCall("now", {})) == 1.0
    assert tool_arguments_match(call("add", "{}"), None) is None
    messages = [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "add", "arguments": {"a": 1, "b": 2}}}],
        }
    ]
    assert tool_arguments_match(messages, reference) == 1.0


@pytest.mark.parametrize(
    ("a", "b", "equal"),
    [
        (1, 1.0, True),
        (True, 1, False),
        (False, False, True),
        ("1", 1, False),
        ([1, {"x": 2}], [1.0, {"x": 2}], True),
        ([1, 2], [2, 1], False),
        ({"x": 1}, {"x": 1, "y": None}, False),
        (None, None, True),
    ],
)
def test_json_equal(a, b, equal):
    assert json_equal(a, b) is equal
