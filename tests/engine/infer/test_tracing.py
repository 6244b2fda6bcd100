"""Chat turns as MLflow traces and ratings/edits as assessments, against a real `mlflow server` on loopback
(the session's `mlflow_server`). The global tracking URI is never set here, and the tracer must leave it as it
found it."""

from __future__ import annotations

import json

import pytest
from mlflow import MlflowClient
from mlflow.tracking._tracking_service import utils as tracking_utils

from dragon_dagster.engine.data.feedback.sqlite import SQLiteFeedbackStore
from dragon_dagster.engine.infer.chat import Chat
from dragon_dagster.engine.infer.local_backend import LocalBackend
from dragon_dagster.engine.infer.server_backend import ServerBackend
from dragon_dagster.engine.infer.tracing import EDITED, THUMBS, ChatTracer
from dragon_dagster.terminal_chat import run_terminal
from tests.support import closed_port, completion


@pytest.fixture()
def traced(mlflow_server, tmp_path, request):
    """A tracer into a fresh experiment of the server, its client, and a feedback store."""
    client = MlflowClient(mlflow_server["url"])
    experiment_id = client.create_experiment(f"chat-{request.node.name}-{tmp_path.name}")
    tracer = ChatTracer(
        mlflow_server["url"],
        experiment_id,
        user="ana",
        model_uri="models:/support@champion",
        model_version="3",
        system_prompt_uri="prompts:/support-system/3",
    )
    return tracer, client, SQLiteFeedbackStore(tmp_path / "feedback.sqlite")


def _trace(client: MlflowClient, trace_id: str):
    trace = client.get_trace(trace_id, display=False)
    assert trace is not None, f"trace {trace_id} is not on the server"
    return trace


@pytest.mark.slow  # a real mlflow server: its start alone is about a minute on 2 cores
def test_local_chat_turns_are_traces_and_ratings_and_edits_their_assessments(chatty_model, traced):
    tracer, client, store = traced
    before = tracking_utils._tracking_uri
    chat = Chat(
        LocalBackend(str(chatty_model), device="cpu"),
        system="Be brief.",
        store=store,
        tracer=tracer,
        max_new_tokens=8,
        temperature=0.0,
    )
    said = chat.say("Where is my order?")
    streamed = "".join(c for c in chat.stream("And the refund?") if isinstance(c, str))
    assert tracking_utils._tracking_uri == before  # the process's tracking URI is as it was
    first, second = (m["trace_id"] for m in chat.messages if m["role"] == "assistant")
    assert first != second

    for trace_id, user_text, reply in ((first, "Where is my order?", said), (second, "And the refund?", streamed)):
        trace = _trace(client, trace_id)
        assert trace.info.experiment_id == tracer.experiment_id
        meta = trace.info.trace_metadata
        assert meta["mlflow.trace.session"] == chat.conversation_id and meta["mlflow.trace.user"] == "ana"
        assert meta["dragon.model"] == chat.model_label and meta["dragon.model_uri"] == "models:/support@champion"
        assert meta["dragon.model_version"] == "3" and meta["dragon.system_prompt_uri"] == "prompts:/support-system/3"
        [span] = trace.data.spans
        assert span.span_type == "CHAT_MODEL"
        messages = span.inputs["messages"]
        assert messages[0] == {"role": "system", "content": "Be brief."} and messages[-1]["content"] == user_text
        assert span.outputs["choices"][0]["message"]["content"] == reply
        usage = span.attributes["mlflow.chat.tokenUsage"]
        assert usage["input_tokens"] > 0 and usage["output_tokens"] >= 0
        assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
        assert span.attributes["dragon.latency_ms"] > 0 and trace.info.execution_duration > 0
    # the second turn's request holds the whole conversation: the trace shows it
    assert [m["role"] for m in _trace(client, second).data.spans[0].inputs["messages"]] == [
        "system",
        "user",
        "assistant",
        "user",
    ]

    up = chat.rate(True, index=0)
    edited = chat.edit("Your refund is on its way.", index=1)
    records = {r["id"]: r for r in store.records()}
    assert records[up]["trace_id"] == first and records[edited]["trace_id"] == second
    assert all(e["assessment_error"] is None for e in chat.feedback)
    [thumbs] = [a for a in _trace(client, first).info.assessments if a.name == THUMBS]
    assert thumbs.feedback.value is True
    assert (thumbs.source.source_type, thumbs.source.source_id) == ("HUMAN", "ana")
    assert thumbs.metadata["dragon.feedback_id"] == str(up)
    [expectation] = [a for a in _trace(client, second).info.assessments if a.name == EDITED]
    assert expectation.expectation.value == "Your refund is on its way."
    assert (expectation.source.source_type, expectation.source.source_id) == ("HUMAN", "ana")
    assert chat.messages[-1]["trace_id"] == second  # the edited reply still answers that traced turn


@pytest.mark.slow  # a real mlflow server: its start alone is about a minute on 2 cores
def test_a_server_backend_chat_is_traced_streamed_or_not(stub, traced):
    tracer, client, store = traced
    server = stub(lambda n, body: (200, completion(f"reply {n}")))
    chat = Chat(ServerBackend(server.url, "stub"), store=store, tracer=tracer)
    assert chat.say("hi") == "reply 1"
    assert "".join(chat.stream("again")) == "reply 2"  # a server answering whole: one chunk
    for m, reply in zip([m for m in chat.messages if m["role"] == "assistant"], ("reply 1", "reply 2")):
        trace = _trace(client, m["trace_id"])
        assert trace.data.spans[0].outputs["choices"][0]["message"]["content"] == reply
        assert trace.info.trace_metadata["dragon.model"] == f"server:{server.url}/chat/completions#stub"


@pytest.mark.slow  # a real mlflow server: its start alone is about a minute on 2 cores
def test_an_unreachable_tracking_server_loses_no_feedback_and_says_so(stub, traced, monkeypatch):
    """The store record is written first: with MLflow gone at rating time it stands (with its trace id), the
    failure names the tracking URI, and the assessment is retried with the next rating."""
    tracer, client, store = traced
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    server = stub(lambda n, body: (200, completion(f"reply {n}")))
    chat = Chat(ServerBackend(server.url, "stub"), store=store, tracer=tracer)
    chat.say("hi")
    trace_id = chat.messages[-1]["trace_id"]
    reachable = tracer.tracking_uri
    tracer.tracking_uri = f"http://127.0.0.1:{closed_port()}"  # the server went away
    said, lines = [], iter(["/up", "/quit"])
    run_terminal(chat, input_fn=lambda prompt: next(lines), print_fn=said.append)
    [record] = store.records()
    assert record["verdict"] == "up" and record["trace_id"] == trace_id
    problem = chat.feedback[-1]["assessment_error"]
    assert tracer.tracking_uri in problem and f"#{record['id']}" in problem and trace_id in problem
    assert any(tracer.tracking_uri in line and "recorded up" in line for line in said), said
    assert len(tracer.pending) == 1 and not _trace(client, trace_id).info.assessments

    tracer.tracking_uri = reachable  # back: the pending assessment goes with the next rating
    chat.rate(False)
    assert not tracer.pending
    values = sorted(a.feedback.value for a in _trace(client, trace_id).info.assessments if a.name == THUMBS)
    assert values == [False, True]
    assert [r["verdict"] for r in store.records()] == ["up", "down"]


def test_an_untraced_chat_keeps_no_trace_id(stub, tmp_path):
    server = stub(lambda n, body: (200, completion("ok")))
    store = SQLiteFeedbackStore(tmp_path / "f.sqlite")
    chat = Chat(ServerBackend(server.url, "stub"), store=store)
    chat.say("hi")
    chat.rate(True)
    assert "trace_id" not in chat.messages[-1] and store.records()[0]["trace_id"] is None
    assert json.loads(json.dumps(chat.history()))[-1] == {"role": "assistant", "content": "ok"}


@pytest.mark.slow  # a real mlflow server
def test_the_chat_page_traces_its_turns_and_its_thumbs(stub, traced):
    import gradio as gr

    from dragon_dagster import chat_handlers

    tracer, client, store = traced
    server = stub(lambda n, body: (200, completion(f"reply {n}")))
    h = chat_handlers.ChatHandlers(
        ServerBackend(server.url, "stub"), store, "stub-model", stream_delay=0, tracer=tracer
    )
    *_, (_, shown, chat, _) = h.send("hi", None, "Be brief.", None, 0.7, 64)
    assert shown["value"][-1]["content"] == "reply 1"
    trace_id = chat.messages[-1]["trace_id"]
    _, chat, status = h.like(chat, gr.LikeData(None, {"index": 1, "value": ["reply 1"], "liked": True}))
    assert "thumbs up on reply 1" in status and "not yet on MLflow" not in status
    trace = _trace(client, trace_id)
    assert trace.info.trace_metadata["mlflow.trace.session"] == chat.conversation_id
    assert trace.data.spans[0].inputs["messages"][0] == {"role": "system", "content": "Be brief."}
    [thumbs] = [a for a in trace.info.assessments if a.name == THUMBS]
    assert thumbs.feedback.value is True and thumbs.source.source_id == "ana"
    assert store.records()[0]["trace_id"] == trace_id
