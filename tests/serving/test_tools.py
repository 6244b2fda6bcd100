"""A tool call over the wire: the official openai client sends a tool's schema to `dragon serve`, gets the model's
call back as OpenAI's `tool_calls` (plain and streamed, the call block never shown as text), sends the tool's answer
back as a tool turn and gets the model's final reply. The model is the tiny one taught to call `bump`."""

import json

import openai
import pytest

from dragon_dagster.engine.tools.declare import Tools, Toolset

from .servers import Serve


@pytest.fixture(scope="module")
def tool_server(tool_caller, tmp_path_factory):
    runs = tmp_path_factory.mktemp("serve-tools")
    server = Serve([str(tool_caller), "--no-trace"], {"DRAGON_RUNS_DIR": str(runs)}, runs / "serve.log")
    yield server
    server.kill()


def test_a_tool_call_comes_back_as_tool_calls_and_its_answer_as_the_reply(tool_server, tool_caller):
    schemas = Toolset.from_settings(Tools(file=str(tool_caller.parent / "tools.py"), timeout=1)).schemas
    client = openai.OpenAI(base_url=f"{tool_server.base}/v1", api_key="unused", max_retries=0)
    asked = [{"role": "user", "content": "Check the counter"}]
    first = client.chat.completions.create(
        model="tool_caller", messages=asked, tools=schemas, temperature=0, max_tokens=24
    )
    [call] = first.choices[0].message.tool_calls
    assert first.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "bump" and json.loads(call.function.arguments) == {}
    assert "<tool_call>" not in (first.choices[0].message.content or "")

    chunks = list(
        client.chat.completions.create(
            model="tool_caller", messages=asked, tools=schemas, temperature=0, max_tokens=24, stream=True
        )
    )
    streamed = [d for c in chunks for d in (c.choices[0].delta.tool_calls or [])]
    shown = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert [d.function.name for d in streamed] == ["bump"] and "<tool_call>" not in shown
    assert chunks[-1].choices[0].finish_reason == "tool_calls"

    answered = asked + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "name": "bump", "content": "count 1"},
    ]
    final = client.chat.completions.create(
        model="tool_caller", messages=answered, tools=schemas, temperature=0, max_tokens=24
    )
    assert final.choices[0].message.content == "Done." and not final.choices[0].message.tool_calls
    assert final.model == "tool_caller/local"
