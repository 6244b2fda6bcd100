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


def test_an_upstream_server_decodes_behind_the_same_front(served, chatty_model, tmp_path):
    """`--upstream`: another OpenAI-compatible server (here `transformers serve`) decodes; the front keeps its names,
    its version header and its refusals."""
    server = Serve(
        [str(chatty_model), "--no-trace", "--upstream", served["url"], "--upstream-model", served["model"]],
        {"DRAGON_RUNS_DIR": str(tmp_path / "runs")},
        tmp_path / "serve.log",
    )
    try:
        ours = openai.OpenAI(base_url=f"{server.base}/v1", api_key="unused", max_retries=0)
        theirs = openai.OpenAI(base_url=served["url"], api_key="unused", max_retries=0)
        asked = [{"role": "user", "content": "My plug is offline"}]
        reply = ours.chat.completions.create(model="chatty", messages=asked, temperature=0, max_tokens=6)
        direct = theirs.chat.completions.create(model=served["model"], messages=asked, temperature=0, max_tokens=6)
        assert reply.choices[0].message.content == direct.choices[0].message.content
        assert reply.model == "chatty/local" and reply.usage.completion_tokens == direct.usage.completion_tokens
        streamed = ours.chat.completions.create(
            model="chatty", messages=asked, temperature=0, max_tokens=6, stream=True
        )
        assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == (
            direct.choices[0].message.content
        )
        with pytest.raises(openai.NotFoundError):
            ours.chat.completions.create(model="other", messages=asked)
    finally:
        server.kill()
    assert "no hot swap" in server.text()
