"""Inference backends against real loopback HTTP servers (a scripted http.server and `transformers serve`) and
a tiny model loaded in this process."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from dragon_dagster.engine.artifacts.manifest import MergedManifest, MergeResult, write_manifest
from dragon_dagster.engine.infer import backend, backend_registry, conversation, local_backend, server_backend
from dragon_dagster.engine.infer.backend import BackendError
from dragon_dagster.engine.infer.backend_registry import as_backend, backend_from_dict
from dragon_dagster.engine.infer.local_backend import LocalBackend, cache_stats, clear_cache
from dragon_dagster.engine.infer.server_backend import ServerBackend
from tests.support import closed_port, completion


def last_user(body) -> str:
    return [m for m in body["messages"] if m["role"] == "user"][-1]["content"]


# ------------------------------------------------------------------------------------------ server backend


def test_server_replies_in_order_with_bounded_concurrency(stub):
    def respond(n, body):
        i = int(last_user(body)[1:])
        time.sleep(0.02 * (6 - i % 6))  # later questions finish first
        return 200, completion(f"  echo {last_user(body)} \n")

    server = stub(respond)
    backend = ServerBackend(server.url, model="m", api_key="sekrit", headers={"X-Team": "dragons"}, concurrency=3)
    replies = backend.chat(
        [[{"role": "user", "content": f"q{i}"}] for i in range(12)],
        max_new_tokens=7,
        temperature=0.3,
        top_p=0.9,
        system="Be brief.",
    )
    assert replies == [f"echo q{i}" for i in range(12)]
    assert 2 <= server.max_in_flight <= 3
    sent = server.requests[0]
    assert sent["path"] == "/v1/chat/completions"
    headers = {k.lower(): v for k, v in sent["headers"].items()}  # names are case-insensitive (httpx sends lower)
    assert headers["authorization"] == "Bearer sekrit" and headers["x-team"] == "dragons"
    assert sent["body"]["model"] == "m" and sent["body"]["max_tokens"] == 7 and sent["body"]["stream"] is False
    assert sent["body"]["temperature"] == 0.3 and sent["body"]["top_p"] == 0.9
    assert sent["body"]["messages"][0] == {"role": "system", "content": "Be brief."}


def test_server_base_url_forms_and_system_replacement(stub):
    server = stub(lambda n, body: (200, completion(json.dumps(body["messages"]))))
    root = server.url[: -len("/v1")]
    for base in (root, root + "/", server.url, server.url + "/chat/completions"):
        assert ServerBackend(base, "m").url == server.url + "/chat/completions"
    conversation = [{"role": "system", "content": "old"}, {"role": "user", "content": "hi"}]
    (reply,) = ServerBackend(root, "m").chat([conversation], system="new")
    assert json.loads(reply) == [{"role": "system", "content": "new"}, {"role": "user", "content": "hi"}]
    assert ServerBackend(root, "m").generate(["plain"]) and server.requests[-1]["body"]["messages"] == [
        {"role": "user", "content": "plain"}
    ]


@pytest.mark.parametrize("status", [500, 503, 429])
def test_server_retries_then_succeeds(stub, status):
    server = stub(lambda n, body: (status, {"error": "busy"}) if n <= 2 else (200, completion("ok")))
    backend = ServerBackend(server.url, "m", retries=3, backoff=0.01)
    assert backend.chat([[{"role": "user", "content": "hi"}]]) == ["ok"]
    assert len(server.requests) == 3


def test_server_gives_up_after_retries_with_status_and_url(stub):
    server = stub(lambda n, body: (502, "<html>bad gateway</html>"))
    with pytest.raises(BackendError) as err:
        ServerBackend(server.url, "m", retries=2, backoff=0.01).chat([[{"role": "user", "content": "hi"}]])
    assert server.url in str(err.value) and "502" in str(err.value) and "3 attempt" in str(err.value)
    assert len(server.requests) == 3


def test_server_client_error_is_not_retried(stub):
    server = stub(lambda n, body: (400, {"error": {"message": "model 'nope' not found"}}))
    with pytest.raises(BackendError, match="400.*not found"):
        ServerBackend(server.url, "nope", retries=3, backoff=0.01).chat([[{"role": "user", "content": "hi"}]])
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    "payload, why", [("<html>hello</html>", "not JSON"), ({"foo": 1}, "choices"), ({"choices": []}, "choices")]
)
def test_server_non_json_or_malformed_response(stub, payload, why):
    server = stub(lambda n, body: (200, payload))
    with pytest.raises(BackendError) as err:
        ServerBackend(server.url, "m", retries=0).chat([[{"role": "user", "content": "hi"}]])
    assert server.url in str(err.value) and "200" in str(err.value) and why in str(err.value)


def test_server_unreachable_fails_fast_naming_the_url():
    url = f"http://127.0.0.1:{closed_port()}/v1"
    start = time.monotonic()
    with pytest.raises(BackendError) as err:
        ServerBackend(url, "m", timeout=2, retries=1, backoff=0.01, concurrency=2).chat(["a", "b", "c"])
    assert url in str(err.value) and "cannot reach" in str(err.value)
    assert time.monotonic() - start < 5


def test_server_content_null_and_parts(stub):
    server = stub(
        lambda n, body: (
            200,
            completion(None if n == 1 else [{"type": "text", "text": "x"}, {"type": "text", "text": "y"}]),
        )
    )
    backend = ServerBackend(server.url, "m", concurrency=1)
    assert backend.chat(["a", "b"]) == ["", "xy"]


# ------------------------------------------------------------------------------------------ config, validation


def test_backend_from_dict():
    local = backend_from_dict({"type": "local", "model": "smollm2-135m", "device": "cpu"})
    assert isinstance(local, LocalBackend) and local.device == "cpu" and local.identity == "local:smollm2-135m"
    server = backend_from_dict({"type": "server", "base_url": "http://h:1/v1", "model": "m", "concurrency": 2})
    assert isinstance(server, ServerBackend) and server.concurrency == 2
    assert server.identity == "server:http://h:1/v1/chat/completions#m"
    assert isinstance(backend_from_dict({"url": "http://h:1", "model": "m"}), ServerBackend)
    assert isinstance(as_backend({"model": "smollm2-135m"}), LocalBackend) and as_backend(server) is server
    with pytest.raises(BackendError, match="'local' or 'server'"):
        backend_from_dict({"type": "ollama", "model": "m"})
    with pytest.raises(BackendError, match=r"unknown setting\(s\) \['temprature'\]"):
        backend_from_dict({"type": "server", "base_url": "http://h", "model": "m", "temprature": 1})
    with pytest.raises(BackendError, match="needs base_url"):
        backend_from_dict({"type": "server", "model": "m"})
    with pytest.raises(BackendError, match="http"):
        ServerBackend("localhost:8000", "m")
    with pytest.raises(BackendError, match="device"):
        LocalBackend("smollm2-135m", device="tpu")


def test_chat_validates_conversations():
    backend = ServerBackend("http://127.0.0.1:9/v1", "m")
    assert backend.chat([]) == []
    with pytest.raises(BackendError, match="list of conversations"):
        backend.chat("hello")
    with pytest.raises(BackendError, match="role"):
        backend.chat([[{"role": "wizard", "content": "x"}]])
    with pytest.raises(BackendError, match="max_new_tokens"):
        backend.chat(["x"], max_new_tokens=0)


def test_a_conversation_keeps_the_tool_keys_of_each_role_only():
    call = [{"type": "function", "function": {"name": "add", "arguments": {"a": 1}}}]
    turns = [
        {"role": "user", "content": "add", "tool_calls": call, "name": "x", "mood": "curious"},
        {"role": "assistant", "content": "", "tool_calls": call, "name": "x"},
        {"role": "tool", "content": "1", "name": "add", "tool_call_id": "c1", "tool_calls": call},
        {"role": "assistant", "content": None, "tool_calls": []},
    ]
    assert conversation.as_conversation(turns) == [
        {"role": "user", "content": "add"},
        {"role": "assistant", "content": "", "tool_calls": call},
        {"role": "tool", "content": "1", "name": "add", "tool_call_id": "c1"},
        {"role": "assistant", "content": None},
    ]
    assert conversation.as_conversation(turns, tool_keys=False)[1] == {"role": "assistant", "content": ""}
    assert conversation.as_conversation("hi") == [{"role": "user", "content": "hi"}]
    for bad in ([{"role": "user"}], [{"content": "x"}], ["hi"], [{"role": "bot", "content": "x"}]):
        with pytest.raises(conversation.ConversationError, match="a role in .*'system'.*'tool'.* and a content"):
            conversation.as_conversation(bad)
    with pytest.raises(conversation.ConversationError, match="non-empty list"):
        conversation.as_conversation([])


def test_the_chat_roles_are_spelled_once():
    """Role (data/conversations.py) is the one list of chat roles: no module of the package writes them out again."""
    from dragon_dagster.engine.data.conversations import ROLES

    assert ROLES == ("system", "user", "assistant", "tool")
    package = Path(backend.__file__).parents[2]
    spelled = [
        str(path.relative_to(package))
        for path in sorted(package.rglob("*.py"))
        if '"system", "user", "assistant", "tool"' in path.read_text()
    ]
    assert spelled == ["engine/data/conversations.py"], spelled


def test_backend_config_is_parsed_by_its_model(monkeypatch):
    # numbers as YAML may give them (strings), read as numbers; a bad value names its setting
    server = backend_from_dict({"base_url": "http://h:1", "model": "m", "concurrency": "2", "timeout": "1e1"})
    assert (server.concurrency, server.timeout, server.retries) == (2, 10.0, 3)  # absent: the backend's default
    with pytest.raises(BackendError, match="server backend: timeout: .*number"):
        backend_from_dict({"base_url": "http://h:1", "model": "m", "timeout": "soon"})
    with pytest.raises(BackendError, match="local backend needs model"):
        backend_from_dict({"type": "local", "model": ""})
    with pytest.raises(
        BackendError, match=r"known: \['batch_size', 'device', 'dtype', 'keep_loaded', 'model', 'seed'\]"
    ):
        backend_from_dict({"type": "local", "model": "m", "url_": 1})
    # the key comes from the environment, and a refused config never echoes it
    monkeypatch.setenv("TEAM_KEY", "sekrit")
    keyed = backend_from_dict({"base_url": "http://h:1", "model": "m", "api_key_env": "TEAM_KEY"})
    assert keyed.api_key == "sekrit"
    with pytest.raises(BackendError, match="TEAM_KEY_UNSET, which is not set"):
        backend_from_dict({"base_url": "http://h:1", "model": "m", "api_key_env": "TEAM_KEY_UNSET"})
    with pytest.raises(BackendError) as err:
        backend_from_dict({"base_url": "http://h:1", "model": "m", "api_key": "sekrit", "retries": "many"})
    assert "retries" in str(err.value) and "sekrit" not in str(err.value)


# ------------------------------------------------------------------------------------------ local backend

CONVERSATIONS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."}],
]


def test_local_backend_keeps_the_model_loaded(chatty_model):
    clear_cache()
    backend = LocalBackend(str(chatty_model), device="cpu")
    first = backend.chat(CONVERSATIONS, max_new_tokens=5)
    assert len(first) == 3 and all(isinstance(r, str) and r for r in first)
    assert cache_stats()["loads"] == 1
    second = LocalBackend(str(chatty_model), device="cpu").chat(CONVERSATIONS, max_new_tokens=5)
    assert second == first  # greedy, same model
    stats = cache_stats()
    assert stats["loads"] == 1 and stats["hits"] == 1
    assert stats["loaded"] == [[str(chatty_model.resolve()), "cpu", "auto"]]


def test_local_backend_evicts_beyond_keep_loaded_and_keep_zero(chatty_model):
    clear_cache()
    a = LocalBackend(str(chatty_model), device="cpu", dtype="float32", keep_loaded=1)
    b = LocalBackend(str(chatty_model), device="cpu", dtype="bfloat16", keep_loaded=1)
    a.chat(["hi"], max_new_tokens=2)
    b.chat(["hi"], max_new_tokens=2)
    a.chat(["hi"], max_new_tokens=2)
    stats = cache_stats()
    assert stats["loads"] == 3 and stats["evictions"] == 2 and stats["loaded"] == [list(a.key)]
    clear_cache()
    none_kept = LocalBackend(str(chatty_model), device="cpu", keep_loaded=0)
    none_kept.chat(["hi"], max_new_tokens=2)
    none_kept.chat(["hi"], max_new_tokens=2)
    assert cache_stats()["loads"] == 2 and cache_stats()["loaded"] == []


def test_local_backend_loads_a_merged_model_artifact(chatty_model, tmp_path):
    artifact = tmp_path / "merged"
    shutil.copytree(chatty_model, artifact / "model")
    write_manifest(
        artifact,
        MergedManifest(
            base_model="chatty",
            resolved_model=str(chatty_model),
            adapters=[],
            settings={},
            info=MergeResult(
                model_dir=str(artifact / "model"), size_mb=0.0, parameters=0, sample_prompt="", sample_reply=""
            ),
        ),
    )
    replies = LocalBackend(str(artifact), device="cpu", keep_loaded=0).chat(CONVERSATIONS[:2], max_new_tokens=5)
    expected = LocalBackend(str(chatty_model), device="cpu").chat(CONVERSATIONS[:2], max_new_tokens=5)
    assert replies == expected


def test_local_backend_bad_model_is_a_backend_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(BackendError, match="cannot load"):
        LocalBackend(str(tmp_path / "empty"), device="cpu").chat(["hi"])


# ------------------------------------------------------------------------------------------ transformers serve


def test_transformers_serve_matches_local_generation(served, chatty_model):
    backend = ServerBackend(served["url"], served["model"], timeout=60, retries=1, backoff=0.1, concurrency=3)
    replies = backend.chat(CONVERSATIONS, max_new_tokens=5)
    assert len(replies) == 3 and all(isinstance(r, str) and r for r in replies)
    local = LocalBackend(str(chatty_model), device="cpu", batch_size=1).chat(CONVERSATIONS, max_new_tokens=5)
    assert replies == local  # greedy decoding of the same weights, over HTTP and in process
    assert backend.chat(list(reversed(CONVERSATIONS)), max_new_tokens=5) == list(reversed(replies))


# ------------------------------------------------------------------------------------------ judge over HTTP


def test_judge_over_a_server_backend(stub, tmp_path):
    from dragon_dagster.engine.evaluate.judge import Judge

    server = stub(lambda n, body: (200, completion('Sure!\n```json\n{"score": "8", "reason": "fine"}\n```')))
    judge = Judge(ServerBackend(server.url, "judge-model", concurrency=2), cache_path=tmp_path / "judge.sqlite")
    scores = judge.score(["Q1", "Q2"], ["R1", "R2"], references=["ref1", None])
    assert [s.score for s in scores] == [8.0, 8.0] and scores[0].reason == "fine"
    sent = sorted((r["body"] for r in server.requests), key=lambda b: "ref1" not in last_user(b))
    assert sent[0]["temperature"] == 0.0 and sent[0]["messages"][0]["role"] == "system"
    assert "<reference_answer>\nref1" in last_user(sent[0]) and "<reference_answer>" not in last_user(sent[1])
    again = Judge(ServerBackend(server.url, "judge-model"), cache_path=tmp_path / "judge.sqlite")
    assert [s.score for s in again.score(["Q1", "Q2"], ["R1", "R2"], references=["ref1", None])] == [8.0, 8.0]
    assert len(server.requests) == 2


def test_module_is_framework_free():
    from dragon_dagster.engine.evaluate import judge

    modules = (backend, backend_registry, conversation, local_backend, server_backend, judge)
    source = "".join(Path(module.__file__).read_text() for module in modules)
    assert "import dagster" not in source and "from dagster" not in source
