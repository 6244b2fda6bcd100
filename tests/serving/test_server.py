"""`dragon serve` on a real MLflow registry, as clients meet it: the official openai client for replies and
streams, every error in OpenAI's shape with its status, sixteen concurrent greedy requests answered as they are
alone, a promotion during a stream, and ratings over HTTP that survive `kill -9` into the feedback store, onto
their traces and into the retraining sensor's count. The models are tiny ones registered as versions of `support`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from dragon_dagster.resources import ArtifactStore

from .servers import Serve, wait_for

pytestmark = pytest.mark.slow

KEY, LIMITED = "sk-test-alice-0123456789", "sk-test-limited-0123456789"


@pytest.fixture(scope="module")
def registry(chatty_model, tiny_model, tmp_path_factory):
    """runs/ with an MLflow registry: support/1 (the chatty model, champion), support/2 and support/3 (tiny ones
    that answer differently), support/4 (one that cannot load)."""
    from dragon_dagster.engine.models import build_tiny_model
    from dragon_dagster.resources.tracking import MLflowTracking

    root = tmp_path_factory.mktemp("serve-registry")
    runs = root / "runs"
    tracking = MLflowTracking(runs_dir=str(runs), tracking_uri=f"sqlite:///{runs / 'mlflow.db'}")
    other = build_tiny_model(root / "other", seed=7)
    broken = root / "broken"  # support/4: its weights cut short, so loading it fails
    shutil.copytree(tiny_model, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    for model in (chatty_model, tiny_model, other, broken):
        tracking.register_model("support", model, None, {"model_dir": str(model)})
    tracking.promote("support", "1", "test")
    return runs, tracking


def env_for(runs: Path) -> dict:
    return {
        "DRAGON_RUNS_DIR": str(runs),
        "MLFLOW_TRACKING_URI": f"sqlite:///{runs / 'mlflow.db'}",
        "DRAGON_SERVE_KEYS": f"alice:{KEY}, limited:{LIMITED} rpm=2",
        "DAGSTER_HOME": str(runs.parent),
    }


@pytest.fixture(scope="module")
def server(registry):
    runs, _ = registry
    serving = Serve(
        ["support", "--watch", "0.5", "--body-limit-kb", "64", "--max-tokens-cap", "512"],
        env_for(runs),
        runs.parent / "serve.log",
    )
    yield serving
    serving.kill()


def client(server, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base}/v1", api_key=key, max_retries=0, timeout=120)


def ask(i: int) -> list[dict]:
    return [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"Ticket {i}: my hub is down"}]


def metrics(server) -> dict:
    text = httpx.get(f"{server.base}/metrics").text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def test_the_openai_client_gets_replies_streams_the_models_and_metrics(server):
    ai = client(server)
    raw = ai.chat.completions.with_raw_response.create(model="support", messages=ask(1), max_tokens=8, temperature=0)
    reply = raw.parse()
    assert raw.headers["x-dragon-model-version"] == "support/1" and reply.model == "support/1"
    assert reply.id.startswith("tr-") and reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 8 and reply.usage.prompt_tokens > 10

    chunks = list(
        ai.chat.completions.create(
            model="support",
            messages=ask(1),
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == reply.choices[0].message.content, "a stream says what the whole reply says"
    assert chunks[-1].usage.completion_tokens == 8 and not chunks[-1].choices
    assert {c.id for c in chunks} == {chunks[0].id} != {reply.id}

    pinned = ai.chat.completions.create(
        model="support@champion", messages=ask(1), max_tokens=8, temperature=0, extra_body={"an_unknown_field": 1}
    )  # ignored, as OpenAI ignores it
    assert pinned.choices[0].message.content == reply.choices[0].message.content

    assert [m.id for m in ai.models.list().data] == ["support"]
    seen = metrics(server)
    assert seen[("dragon_serve_requests_total", (("status", "200"), ("version", "support/1")))] >= 3
    assert seen[("dragon_serve_time_to_first_token_seconds_count", (("version", "support/1"),))] >= 3
    assert seen[("dragon_serve_model_version", (("alias", "champion"), ("name", "support")))] == 1
    assert ("dragon_serve_queue_depth", ()) in seen


def test_dragon_chat_talks_to_it_through_the_server_backend(server, registry):
    import subprocess
    import sys

    runs, _ = registry
    env = {**os.environ, **env_for(runs), "DRAGON_API_KEY": KEY}
    said = subprocess.run(
        [sys.executable, "-m", "dragon_dagster.cli", "chat", "support", "--server", f"{server.base}/v1"],
        input="My hub is down\n/up\n/quit\n",
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert said.returncode == 0, said.stderr[-2000:]
    assert "recorded up (feedback #" in said.stdout
    [record] = [
        r
        for r in ArtifactStore(runs_dir=str(runs)).feedback_store("support").records()
        if r["turns"][-1]["content"] == "My hub is down"
    ]
    assert record["verdict"] == "up" and record["reply"]


def error_of(call) -> tuple[int, dict, httpx.Headers]:
    with pytest.raises(openai.APIStatusError) as refused:
        call()
    return refused.value.status_code, refused.value.body, refused.value.response.headers


def test_each_refusal_is_an_openai_error_with_its_status(server):
    ai = client(server)
    create = ai.chat.completions.create
    status, body, _ = error_of(lambda: create(model="support", messages=ask(1), temperature=3))
    assert status == 400 and body["param"] == "temperature" and body["type"] == "invalid_request_error"
    status, body, _ = error_of(lambda: create(model="support", messages=ask(1), max_tokens=9999))
    assert status == 400 and "cap of 512" in body["message"]
    status, body, _ = error_of(
        lambda: client(server, "sk-wrong").chat.completions.create(model="support", messages=ask(1))
    )
    assert status == 401 and body["code"] == "invalid_api_key"
    status, body, _ = error_of(lambda: create(model="nothing", messages=ask(1)))
    assert status == 404 and body["code"] == "model_not_found" and "served: support" in body["message"]
    status, body, _ = error_of(lambda: create(model="support", messages=[{"role": "user", "content": "w " * 1500}]))
    assert status == 413 and body["code"] == "context_length_exceeded" and "1024" in body["message"]
    status, body, _ = error_of(lambda: create(model="support", messages=[{"role": "user", "content": "w" * 70_000}]))
    assert status == 413 and body["code"] == "body_too_large"

    limited = client(server, LIMITED).chat.completions.create
    for _ in range(2):
        limited(model="support", messages=ask(2), max_tokens=2)
    status, body, headers = error_of(lambda: limited(model="support", messages=ask(2), max_tokens=2))
    assert status == 429 and 1 <= int(headers["retry-after"]) <= 60 and "2 requests per minute" in body["message"]

    status, body, _ = error_of(lambda: create(model="support/99", messages=ask(1), max_tokens=2))
    assert status == 404 and "no version 99" in body["message"]
    status, body, headers = error_of(lambda: create(model="support/2", messages=ask(1), max_tokens=2))
    assert status == 503 and body["code"] == "model_loading" and headers["retry-after"]
    loaded = wait_for(lambda: _answers(ai, "support/2"), 120, "support/2 to load")
    assert loaded.model == "support/2"


def _answers(ai, model):
    try:
        return ai.chat.completions.create(model=model, messages=ask(1), max_tokens=2, temperature=0)
    except openai.APIStatusError as exc:
        assert exc.status_code == 503, exc.body
        return None


def test_sixteen_concurrent_greedy_requests_get_the_replies_they_get_alone(server):
    ai = client(server)

    def one(i: int) -> str:
        return (
            ai.chat.completions.create(model="support", messages=ask(i), max_tokens=16, temperature=0)
            .choices[0]
            .message.content
        )

    alone = [one(i) for i in range(16)]
    with ThreadPoolExecutor(16) as pool:
        together = list(pool.map(one, range(16)))
    assert together == alone and len(set(alone)) > 1


def test_a_promotion_during_a_stream_ends_it_on_the_old_version_and_the_next_gets_the_new(server, registry):
    _, tracking = registry
    ai = client(server)
    stream = ai.chat.completions.create(model="support", messages=ask(5), max_tokens=300, temperature=0, stream=True)
    first = next(iter(stream))
    tracking.promote("support", "3", "test: promoted mid-stream")
    rest = list(stream)
    assert {c.model for c in [first, *rest]} == {"support/1"} and rest[-1].choices[0].finish_reason
    after = wait_for(
        lambda: (
            (r := ai.chat.completions.create(model="support", messages=ask(5), max_tokens=2)).model == "support/3" and r
        ),
        60,
        "the champion to be swapped",
    )
    assert after.model == "support/3"
    assert "support@champion is now version 3 (was 1)" in server.text()

    tracking.promote("support", "4", "test: a version that cannot load")
    wait_for(lambda: "moved to version 4, which cannot be loaded" in server.text(), 60, "the failed load to be said")
    assert metrics(server)[("dragon_serve_model_load_failures_total", (("name", "support"), ("version", "4")))] == 1
    kept = ai.chat.completions.create(model="support", messages=ask(5), max_tokens=2)
    assert kept.model == "support/3", "the old version keeps serving"
    tracking.promote("support", "3", "test: back to a version that loads")
    failures = {
        k: v
        for k, v in metrics(server).items()
        if k[0] == "dragon_serve_requests_total" and k[1][0][1] not in ("200", "400", "401", "404", "413", "429", "503")
    }
    assert not failures, failures


def test_ratings_over_http_survive_kill_9_into_the_store_their_traces_and_the_sensor(registry, tmp_path):
    from dagster import DagsterInstance, build_sensor_context
    from mlflow.tracing.client import TracingClient

    from dragon_dagster.assets.factory import build_pipeline_defs
    from dragon_dagster.assets.launch import find_pipeline

    runs, tracking = registry
    serving = Serve(["support", "--watch", "0"], env_for(runs), tmp_path / "serve.log")
    ai = client(serving)
    rate = f"{serving.base}/v1/feedback"
    auth = {"Authorization": f"Bearer {KEY}"}
    replies = [
        ai.chat.completions.create(model="support", messages=ask(i), max_tokens=4, temperature=0) for i in range(4)
    ]
    acknowledged = {}
    for i, reply in enumerate(replies):
        body = {"completion_id": reply.id, "rating": "like" if i % 2 else "dislike", "user": f"user{i}"}
        answer = httpx.post(rate, json=body, headers=auth, timeout=60)
        assert answer.status_code == 200 and answer.json()["assessment"] == "logged", answer.text
        acknowledged[reply.id] = answer.json()["id"]
    changed = httpx.post(
        rate,
        json={"completion_id": replies[0].id, "rating": "like", "user": "user0", "comment": "on second thought"},
        headers=auth,
        timeout=60,
    ).json()
    assert changed["replaced"] and changed["id"] == acknowledged[replies[0].id]
    assert httpx.post(rate, json={"completion_id": "tr-nothing", "rating": "like"}, headers=auth).status_code == 404

    streams = []  # other clients mid-stream when the server dies
    for i in range(3):
        thread = threading.Thread(target=lambda i=i: _drain(ai, i, streams), daemon=True)
        thread.start()
    wait_for(lambda: len(streams) == 3, 60, "three streams to start")
    serving.kill(signal.SIGKILL)

    store = ArtifactStore(runs_dir=str(runs)).feedback_store("support")
    records = {r["trace_id"]: r for r in store.records()}
    assert {t: r["id"] for t, r in records.items() if t in acknowledged} == acknowledged
    assert [records[reply.id]["verdict"] for reply in replies] == ["up", "up", "down", "up"]  # user0 changed
    assert records[replies[1].id]["model"] == f"models:/{replies[1].model}"
    assert records[replies[1].id]["reply"] == replies[1].choices[0].message.content
    traces = TracingClient(tracking.uri)
    for i, reply in enumerate(replies):
        thumbs = [a for a in traces.get_trace(reply.id).info.assessments if a.name == "thumbs"]
        assert [(a.source.source_id, a.value) for a in thumbs] == [(f"user{i}", i % 2 == 1 or i == 0)]

    again = Serve(["support", "--watch", "0"], env_for(runs), tmp_path / "again.log")  # restarted: read from traces
    try:
        revised = httpx.post(
            f"{again.base}/v1/feedback",
            json={"completion_id": replies[2].id, "rating": "like", "user": "user2"},
            headers=auth,
            timeout=60,
        ).json()
        assert revised["replaced"] and revised["id"] == acknowledged[replies[2].id]
    finally:
        again.kill()
    assert len([r for r in store.records() if r["trace_id"] in acknowledged]) == 4, "revised in place: no new record"
    stored = store.count()  # with the dragon chat test's rating, when it ran before

    pipeline = find_pipeline("support")
    [sensor_def] = build_pipeline_defs(pipeline)["sensors"]
    with DagsterInstance.ephemeral() as instance:
        with build_sensor_context(instance=instance, resources={"store": ArtifactStore(runs_dir=str(runs))}) as ctx:
            tick = sensor_def.evaluate_tick(ctx)
    assert tick.skip_message.startswith(f"{stored} new feedback records since the last successful retraining")


def _drain(ai, i: int, started: list) -> None:
    try:
        stream = ai.chat.completions.create(
            model="support", messages=ask(10 + i), max_tokens=500, temperature=0, stream=True
        )
        for n, _ in enumerate(stream):
            if n == 1:
                started.append(i)
    except Exception:  # noqa: BLE001 - the server was killed under it
        pass


def test_the_server_says_it_is_open_when_no_key_is_set(registry, tmp_path):
    runs, _ = registry
    env = {**env_for(runs), "DRAGON_SERVE_KEYS": ""}
    serving = Serve(["support", "--watch", "0", "--no-trace"], env, tmp_path / "open.log")
    try:
        first = next(line for line in serving.text().splitlines() if " INFO " in line or " WARNING " in line)
        assert "OPEN: no API key is configured" in first
        answered = client(serving, "anything").chat.completions.create(model="support", messages=ask(1), max_tokens=2)
        assert answered.model.startswith("support/")
    finally:
        serving.kill()
    assert KEY not in serving.text() and LIMITED not in json.dumps(serving.text())
