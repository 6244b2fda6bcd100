"""Conversation layouts (OpenAI messages, ShareGPT, Alpaca, prompt/response columns): each mapped to TRL's
prompt-completion rows, detected when not declared, and every malformed row named by row and field."""

import json

import pandas as pd
import pytest

from dragon_dagster.engine.data import holdout, row_mapping, row_parts, tables
from dragon_dagster.engine.data.errors import DataError
from dragon_dagster.engine.data.row_mapping import Mapping
from dragon_dagster.engine.stages.chat_dataset.settings import ChatDataset

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def tool_conversation(arguments='{"city": "Paris"}'):
    return [
        {"role": "system", "content": "You help with weather."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! Ask me about the weather."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
            ],
        },
        {"role": "tool", "name": "get_weather", "tool_call_id": "call_1", "content": {"temp_c": 21}},
        {"role": "assistant", "content": "It is 21 C in Paris."},
    ]


def error_of(df, mapping=None):
    with pytest.raises(DataError) as caught:
        row_mapping.map_rows(df, mapping or Mapping())
    return str(caught.value)


def test_openai_messages_keep_tool_calls_tool_turns_and_tools():
    frame = pd.DataFrame(
        {
            "messages": [tool_conversation(), json.dumps(tool_conversation({"city": "Paris"}))],
            "tools": [[WEATHER_TOOL], json.dumps([WEATHER_TOOL["function"]])],  # a bare schema is wrapped
        }
    )
    first, second = row_mapping.map_rows(frame, Mapping(layout="messages"))
    assert first == second  # arguments as JSON text or an object, tools as a list or JSON text: the same row
    call_turn, tool_turn = first["prompt"][4], first["prompt"][5]
    assert call_turn == {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}, "id": "call_1"}
        ],
    }
    assert tool_turn == {"role": "tool", "content": '{"temp_c": 21}', "name": "get_weather", "tool_call_id": "call_1"}
    assert [m["role"] for m in first["prompt"]] == ["system", "user", "assistant", "user", "assistant", "tool"]
    assert first["completion"] == [{"role": "assistant", "content": "It is 21 C in Paris."}]
    assert first["tools"] == [WEATHER_TOOL]
    # the engine's helpers read such rows: the last user turn, the reply, a key that counts the tools
    assert row_parts.user_text(first) == "Weather in Paris?" and row_parts.reply_text(first) == "It is 21 C in Paris."
    assert holdout.row_key(first) != holdout.row_key({k: v for k, v in first.items() if k != "tools"})
    assert row_parts.quality([first, second])["duplicate_share"] == 0.5


def test_a_reply_that_only_calls_a_tool_is_a_reply_not_an_empty_one():
    conversation = tool_conversation()[:5]  # ends with the assistant's call
    (row,) = row_mapping.map_rows(pd.DataFrame({"messages": [conversation]}), Mapping())
    assert row["completion"][0]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert row_parts.quality([row])["empty_replies"] == 0


def test_sharegpt_speakers_and_function_calls_become_messages():
    turns = [
        {"from": "system", "value": "You help with weather."},
        {"from": "human", "value": "Weather in Paris and Rome?"},
        {"from": "function_call", "value": '{"name": "get_weather", "arguments": {"city": "Paris"}}'},
        {"from": "function_call", "value": {"name": "get_weather", "arguments": '{"city": "Rome"}'}},
        {"from": "observation", "value": "21 C"},
        {"from": "function_response", "value": "25 C"},
        {"from": "gpt", "value": "Paris 21 C, Rome 25 C."},
        {"from": "user", "value": "Thanks"},
        {"from": "model", "value": "You are welcome."},
    ]
    (row,) = row_mapping.map_rows(pd.DataFrame({"conversations": [turns], "tools": [[WEATHER_TOOL]]}), Mapping())
    roles = [m["role"] for m in row["prompt"]]
    assert roles == ["system", "user", "assistant", "tool", "tool", "assistant", "user"]
    calls = row["prompt"][2]["tool_calls"]  # consecutive function_call turns: one turn making both calls
    assert [c["function"]["arguments"] for c in calls] == [{"city": "Paris"}, {"city": "Rome"}]
    assert row["prompt"][2]["content"] == "" and row["prompt"][3]["content"] == "21 C"
    assert row["completion"] == [{"role": "assistant", "content": "You are welcome."}]
    assert row["tools"] == [WEATHER_TOOL]
    # declared, a sharegpt column named otherwise reads the same
    frame = pd.DataFrame({"chat": [json.dumps(turns)]})
    assert row_mapping.map_rows(frame, Mapping(conversations="chat", layout="sharegpt"))[0]["prompt"] == row["prompt"]


def test_alpaca_instruction_and_input_make_the_user_turn():
    frame = pd.DataFrame(
        {"instruction": ["Add the numbers.", "Say hello."], "input": ["2 and 3", ""], "output": ["5", "Hello!"]}
    )
    rows = row_mapping.map_rows(frame, Mapping(system="Be brief."))
    assert rows[0] == {
        "prompt": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Add the numbers.\n\n2 and 3"},
        ],
        "completion": [{"role": "assistant", "content": "5"}],
    }
    assert rows[1]["prompt"][1] == {"role": "user", "content": "Say hello."}
    no_input = frame.drop(columns="input")
    assert row_mapping.map_rows(no_input, Mapping(layout="alpaca"))[0]["prompt"] == [
        {"role": "user", "content": "Add the numbers."}
    ]


def test_auto_detection_picks_the_layout_from_settings_and_columns():
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    sharegpt = [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]
    expected = {"prompt": [{"role": "user", "content": "q"}], "completion": [{"role": "assistant", "content": "a"}]}
    both = pd.DataFrame({"p": ["q"], "r": ["a"], "messages": [[{"role": "user", "content": "other"}]]})
    assert row_mapping.map_rows(both, Mapping(prompt="p", response="r")) == [expected]  # prompt/response win
    assert row_mapping.map_rows(pd.DataFrame({"messages": [messages]}), Mapping()) == [expected]
    assert row_mapping.map_rows(pd.DataFrame({"conversations": [messages]}), Mapping()) == [expected]  # role/content
    assert row_mapping.map_rows(pd.DataFrame({"conversations": [sharegpt]}), Mapping()) == [expected]  # from/value
    assert row_mapping.map_rows(pd.DataFrame({"instruction": ["q"], "output": ["a"]}), Mapping()) == [expected]
    message = error_of(pd.DataFrame({"question": ["q"], "answer": ["a"]}))
    assert "cannot tell the dataset's layout" in message and "'messages'" in message and "instruction" in message
    assert "['question', 'answer']" in message
    # the stage's settings: no mapping at all is auto; preflight finds an undetectable header before training
    stage = ChatDataset(name="chats", kind="chat_dataset", path="x.jsonl")
    assert stage.layout == "auto" and stage.layout_problems(["messages"]) == []
    assert "cannot tell the dataset's layout" in stage.layout_problems(["question", "answer"])[0]
    with pytest.raises(ValueError, match="columns layout needs prompt and response"):
        ChatDataset(name="chats", kind="chat_dataset", path="x.jsonl", layout="columns")
    with pytest.raises(ValueError, match="not both"):
        ChatDataset(name="chats", kind="chat_dataset", path="x.jsonl", prompt="p", response="r", conversations="m")


def test_parquet_arrays_read_like_lists(tmp_path):
    conversation = tool_conversation()
    conversation[5] = {**conversation[5], "content": "21 C"}  # Arrow holds one type per field: text here
    pd.DataFrame({"messages": [conversation]}).to_parquet(tmp_path / "chats.parquet")
    table = tables.read_table(tmp_path / "chats.parquet")
    assert type(table["messages"][0]).__name__ == "ndarray"  # lists of structs, missing keys filled with None
    (row,) = row_mapping.map_rows(table, Mapping())
    assert row["prompt"][4]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert row["prompt"][1] == {"role": "user", "content": "Hi"}  # no None-filled tool_calls or name kept
    assert row["prompt"][5] == {"role": "tool", "content": "21 C", "name": "get_weather", "tool_call_id": "call_1"}


@pytest.mark.parametrize(
    ("turns", "expected"),
    [
        ([{"role": "user", "content": "a"}, {"role": "bot", "content": "b"}], "row 3, messages[1]: unknown role 'bot'"),
        (
            [
                {"role": "user", "content": "a"},
                {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]},
            ],
            "row 3, messages[1].tool_calls[0].function.arguments: not JSON",
        ),
        (
            [
                {"role": "user", "content": "a"},
                {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1, 2]"}}]},
            ],
            "row 3, messages[1].tool_calls[0].function.arguments: must be a JSON object",
        ),
        (
            [{"role": "user", "content": "a"}, {"role": "assistant", "tool_calls": [{"function": {"arguments": {}}}]}],
            "row 3, messages[1].tool_calls[0].function.name",
        ),
        (
            [{"role": "user", "content": "a"}, {"role": "tool", "content": "r"}, {"role": "assistant", "content": "b"}],
            "row 3, messages[1]: a tool turn must follow an assistant turn that calls tools",
        ),
        ([{"role": "user", "content": "a"}, "b"], "row 3, messages[1]: a message must be an object"),
        ('[{"role": "user"', "row 3, messages: not JSON"),
        ([{"role": "user", "content": "a"}], "row 3: the conversation must end with an assistant turn"),
        (
            [{"role": "system", "content": "s"}, {"role": "assistant", "content": "b"}],
            "row 3: the conversation has no user turn",
        ),
    ],
)
def test_a_malformed_messages_row_names_its_row_and_field(turns, expected):
    good = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    assert expected in error_of(pd.DataFrame({"messages": [good, good, turns]}))


def test_malformed_sharegpt_alpaca_and_tools_rows_name_their_row_and_field():
    good = [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]
    bad_speaker = [{"from": "human", "value": "q"}, {"from": "bot", "value": "a"}]
    assert "row 2, conversations[1].from: unknown speaker 'bot'" in error_of(
        pd.DataFrame({"conversations": [good, bad_speaker]}), Mapping(layout="sharegpt")
    )
    bad_call = [{"from": "human", "value": "q"}, {"from": "function_call", "value": "get_weather(Paris)"}]
    assert "row 1, conversations[1].value: not JSON" in error_of(
        pd.DataFrame({"conversations": [bad_call]}), Mapping(layout="sharegpt")
    )
    alpaca = pd.DataFrame({"instruction": ["a", "b"], "output": ["x", None]})
    assert "row 2: alpaca layout needs column 'output'" in error_of(alpaca)
    assert "alpaca layout needs column(s) ['output']" in error_of(
        pd.DataFrame({"instruction": ["a"]}), Mapping(layout="alpaca")
    )
    plain = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    tools = pd.DataFrame({"messages": [plain, plain], "tools": ["[]", "{bad"]})
    assert "row 2, tools: not JSON" in error_of(tools)
    (row,) = row_mapping.map_rows(tools.iloc[:1], Mapping())
    assert "tools" not in row  # an empty list is no tools
