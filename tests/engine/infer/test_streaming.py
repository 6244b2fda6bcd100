"""Streamed replies: a tiny model generating in this process (TextIteratorStreamer), `transformers serve` and
scripted OpenAI-compatible servers on loopback (real HTTP, server-sent events), the Chat API and the terminal
with Stop / Ctrl-C, and the chat page in a real Chromium growing a reply and stopping one."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from dragon_dagster.engine.data.feedback.sqlite import SQLiteFeedbackStore
from dragon_dagster.engine.infer.backend import Backend, BackendError
from dragon_dagster.engine.infer.chat import Chat
from dragon_dagster.engine.infer.chat_messages import ChatError
from dragon_dagster.engine.infer.local_backend import LocalBackend
from dragon_dagster.engine.infer.server_backend import ServerBackend
from dragon_dagster.terminal_chat import run_terminal
from tests.support import CHROMIUM_ARGS, WAIT_MS, closed_port, free_port

HELLO = [{"role": "user", "content": "Hello there, who are you?"}]
LONG = 900  # new tokens: a few seconds of the tiny model on two cores (its context is 1024 tokens)


def generating_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "dragon-stream-generate"]


@pytest.fixture()
def local(chatty_model) -> LocalBackend:
    return LocalBackend(str(chatty_model), device="cpu")


# ------------------------------------------------------------------------------------------ local model


def test_local_stream_joins_to_the_greedy_reply_in_several_chunks(local):
    (whole,) = local.chat([HELLO], max_new_tokens=40)
    chunks = list(local.stream(HELLO, max_new_tokens=40))
    assert len(chunks) > 1 and all(chunks)
    assert "".join(chunks) == whole
    assert not generating_threads()
    # the Chat API: chunks as they come, then the reply in the history, not stopped
    chat = Chat(local, max_new_tokens=40, temperature=0)
    reply = chat.stream(HELLO[0]["content"])
    assert chat.messages == []  # nothing happens before the stream is read
    assert "".join(reply) == whole == reply.text
    assert reply.done and not reply.stopped and not chat.is_stopped()
    assert chat.history() == [HELLO[0], {"role": "assistant", "content": whole}]


def test_local_stop_mid_stream_keeps_a_shorter_reply_and_ends_the_thread(local, tmp_path):
    (full,) = local.chat([HELLO], max_new_tokens=300)
    stop = threading.Event()
    chunks = []
    for chunk in local.stream(HELLO, max_new_tokens=300, stop=stop):
        chunks.append(chunk)
        if len(chunks) == 3:
            stop.set()
    text = "".join(chunks)
    assert 3 <= len(chunks) <= 6 and len(text) < len(full) / 3  # ended at the next token or two
    assert full.startswith(text)
    assert not generating_threads()

    # in a Chat: the stopped text is the reply, marked stopped, and rating and editing work as for any reply
    store = SQLiteFeedbackStore(tmp_path / "fb.sqlite")
    chat = Chat(local, max_new_tokens=300, temperature=0, store=store)
    reply = chat.stream(HELLO[0]["content"])
    for i, _ in enumerate(reply):
        if i == 2:
            chat.stop()
    assert reply.stopped and reply.done and chat.active is None and full.startswith(reply.text)
    assert chat.messages[-1] == {"role": "assistant", "content": reply.text, "stopped": True}
    assert chat.is_stopped() and chat.history()[-1] == {"role": "assistant", "content": reply.text}
    chat.rate(False)
    chat.edit("A complete answer.")
    assert [(r["verdict"], r["reply"], r["edited"]) for r in store.records()] == [
        ("down", reply.text, None),
        ("edit", reply.text, "A complete answer."),
    ]
    assert not chat.is_stopped()  # the edited reply is whole
    # the conversation goes on; a regenerated reply streams and replaces the last one
    chat.max_new_tokens = 20
    again = chat.stream_regenerate()
    assert "".join(again) and chat.messages[-1]["content"] == again.text and len(chat.messages) == 2

    # a reader that leaves early (closes the stream) stops the generation too, and frees the model
    early = local.stream(HELLO, max_new_tokens=LONG)
    next(early)
    started = time.monotonic()
    early.close()
    assert not generating_threads() and time.monotonic() - started < 2
    assert full.startswith("".join(local.stream(HELLO, max_new_tokens=40)))  # the model is free again


class Whole(Backend):
    """A backend that cannot stream (Backend's fallback: the whole reply as one chunk, unless stopped first)."""

    def __init__(self):
        self.asked, self.seen = 0, []

    def _chat(self, conversations, **settings):
        self.asked += len(conversations)
        self.seen += [c[-1]["content"] for c in conversations]
        return [f"  reply {self.asked}  " for _ in conversations]


def test_stop_before_any_text_leaves_the_history_as_it_was():
    backend = Whole()
    chat = Chat(backend)
    assert "".join(chat.stream("first")) == "reply 1"  # stripped, like chat()
    before = [dict(m) for m in chat.messages]
    never_read = chat.stream("second")
    never_read.close()
    assert chat.messages == before and chat.active is None and backend.asked == 1
    stopped_early = chat.stream("second")
    stopped_early.stop()
    assert list(stopped_early) == [] and stopped_early.stopped and stopped_early.done
    assert chat.messages == before and chat.active is None and backend.asked == 1  # the turn is taken back
    regen = chat.stream_regenerate()
    regen.stop()
    assert list(regen) == [] and chat.messages == before  # the old reply stays
    busy = chat.stream("third")
    next(busy)
    with pytest.raises(ChatError, match="still being generated"):
        chat.stream("fourth")
    with pytest.raises(ChatError, match="still being generated"):
        chat.undo()
    assert list(busy) == [] and chat.messages[-1] == {"role": "assistant", "content": "reply 2"}
    # streams made before either runs each send their own message, one after the other
    a, b = chat.stream("A"), chat.stream("B")
    assert "".join(a) == "reply 3" and "".join(b) == "reply 4" and backend.seen[-2:] == ["A", "B"]


def test_terminal_prints_tokens_as_they_come_and_ctrl_c_stops_only_the_reply(local, tmp_path):
    store = SQLiteFeedbackStore(tmp_path / "fb.sqlite")
    chat = Chat(local, max_new_tokens=LONG, temperature=0, store=store)
    writes, printed = [], []

    def write(text):
        writes.append(text)
        if script_state["line"] == "hello" and len(writes) == 3:
            raise KeyboardInterrupt  # Ctrl-C while the reply is being printed
        if script_state["line"] == "tell me more" and len(writes) == 1:
            # a real SIGINT a moment after the reply starts: the main thread is most likely waiting on the model
            threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()

    script_state = {"line": None}
    lines = iter(["hello", "/up", "tell me more", "/history", "/quit"])

    def read(prompt):
        script_state["line"] = line = next(lines)
        writes.clear()
        return line

    run_terminal(chat, input_fn=read, print_fn=lambda *a: printed.append(" ".join(map(str, a))), write_fn=write)
    out = "\n".join(printed)
    assert out.count("(stopped: reply kept as far as it got)") == 2 and "recorded up (feedback #1)" in out
    replies = [m for m in chat.messages if m["role"] == "assistant"]
    assert len(replies) == 2 and all(m.get("stopped") for m in replies)
    assert store.records()[0]["reply"] == replies[0]["content"] and len(replies[0]["content"]) > 0
    tokens = local.loaded()["tokenizer"](replies[1]["content"])["input_ids"]
    assert 0 < len(tokens) < LONG / 2  # the SIGINT cut the long reply short
    assert "[user] tell me more" in out and not generating_threads()


# ------------------------------------------------------------------------------------------ servers


def test_stream_over_transformers_serve_matches_the_whole_reply(served):
    backend = ServerBackend(served["url"], served["model"], timeout=60, retries=1, backoff=0.1)
    (whole,) = backend.chat([HELLO], max_new_tokens=24)
    chunks = list(backend.stream(HELLO, max_new_tokens=24))
    assert len(chunks) > 1 and "".join(chunks) == whole
    stop = threading.Event()
    got = []
    for chunk in backend.stream(HELLO, max_new_tokens=200, stop=stop):
        got.append(chunk)
        stop.set()
    assert len(got) == 1  # the connection is closed at the first chunk after the stop


class SSEServer:
    """A real HTTP server on loopback answering /v1/chat/completions with server-sent events: `script(n, body)`
    returns (status, events or payload, seconds between events); "BREAK" as an event drops the connection."""

    def __init__(self, script):
        self.requests, server = [], self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                server.requests.append(
                    {"body": body, "headers": {k.lower(): v for k, v in self.headers.items()}, "at": time.monotonic()}
                )
                status, events, gap = script(len(server.requests), body)
                if not isinstance(events, list):
                    data = json.dumps(events).encode()
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                self.send_response(status)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for event in events:
                    if event == "BREAK":
                        self.wfile.write(b"5\r\nda")  # a chunk cut short, then the connection is gone
                        self.wfile.flush()
                        self.connection.shutdown(2)
                        return
                    line = b"data: " + (event if isinstance(event, bytes) else json.dumps(event).encode()) + b"\n\n"
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                    self.wfile.flush()
                    time.sleep(gap)
                self.wfile.write(b"0\r\n\r\n")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def delta(text: str) -> dict:
    return {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}],
    }


@pytest.fixture()
def sse():
    servers = []

    def start(script) -> SSEServer:
        servers.append(SSEServer(script))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def test_server_stream_retries_then_streams_as_the_server_sends(sse, monkeypatch):
    # what an OpenAI SDK would pick up from the environment must not reach this (not OpenAI's) server
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    monkeypatch.setenv("OPENAI_ORG_ID", "org-env")
    monkeypatch.setenv("OPENAI_CUSTOM_HEADERS", "X-Leak: yes")
    words = ["  Once", " upon", " a", " time.  ", "\n"]
    server = sse(
        lambda n, body: (
            (503, {"error": "warming up"}, 0) if n <= 2 else (200, [delta(w) for w in words] + [b"[DONE]"], 0.3)
        )
    )
    backend = ServerBackend(server.url, "m", retries=3, backoff=0.01, headers={"X-Team": "dragons"})
    arrivals, chunks = [], []
    for chunk in backend.stream(HELLO, max_new_tokens=9, temperature=0.5, system="Be brief."):
        arrivals.append(time.monotonic())
        chunks.append(chunk)
    assert "".join(chunks) == "Once upon a time." and len(chunks) == 4
    assert arrivals[-1] - arrivals[0] > 0.6  # each chunk shown when the server sent it, not all at the end
    assert len(server.requests) == 3
    sent = server.requests[-1]
    assert sent["body"]["stream"] is True and sent["body"]["max_tokens"] == 9 and sent["body"]["temperature"] == 0.5
    assert sent["body"]["messages"][0] == {"role": "system", "content": "Be brief."}
    assert sent["headers"]["x-team"] == "dragons" and "authorization" not in sent["headers"]
    assert "openai-organization" not in sent["headers"] and "x-leak" not in sent["headers"]
    keyed = list(ServerBackend(server.url, "m", api_key="sekrit").stream("hi"))
    assert keyed and server.requests[-1]["headers"]["authorization"] == "Bearer sekrit"


def test_server_stream_errors_are_clear(sse):
    url = f"http://127.0.0.1:{closed_port()}/v1"
    started = time.monotonic()
    with pytest.raises(BackendError) as err:
        list(ServerBackend(url, "m", timeout=2, retries=1, backoff=0.01).stream("hi"))
    assert "cannot reach" in str(err.value) and url in str(err.value) and "2 attempt" in str(err.value)
    assert time.monotonic() - started < 5

    server = sse(lambda n, body: (500, {"error": "model exploded"}, 0))
    with pytest.raises(BackendError, match=r"HTTP 500 after 2 attempt\(s\).*model exploded"):
        list(ServerBackend(server.url, "m", retries=1, backoff=0.01).stream("hi"))

    broken = sse(lambda n, body: (200, [delta("Half"), delta(" a reply"), "BREAK"], 0))
    got = []
    with pytest.raises(BackendError, match="stream from .* broke after 12 character"):
        for chunk in ServerBackend(broken.url, "m", retries=0).stream("hi"):
            got.append(chunk)
    assert got == ["Half", " a reply"]  # what came before the break was delivered

    whole = sse(
        lambda n, body: (
            200,
            {"choices": [{"index": 0, "message": {"role": "assistant", "content": " all at once "}}]},
            0,
        )
    )
    assert list(ServerBackend(whole.url, "m").stream("hi")) == ["all at once"]  # a server that ignores stream

    # a Chat whose turn fails keeps its history and says why
    chat = Chat(ServerBackend(server.url, "m", retries=0))
    with pytest.raises(BackendError, match="HTTP 500"):
        list(chat.stream("hi"))
    assert chat.messages == [] and chat.active is None


# ------------------------------------------------------------------------------------------ the chat page


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_chat_page_streams_a_reply_and_stop_keeps_it_in_a_real_browser(chromium, chatty_model, tmp_path):  # noqa: F811
    from playwright.sync_api import expect, sync_playwright
    from transformers import AutoTokenizer

    from dragon_dagster import chat_ui
    from dragon_dagster.page_serving import PageServing

    store = SQLiteFeedbackStore(tmp_path / "feedback.db")
    backend = LocalBackend(str(chatty_model), device="cpu")
    app = chat_ui.build_app(backend, store, "chatty", temperature=0.0, max_new_tokens=LONG)
    url = chat_ui.start(app, PageServing(port=free_port(), block=False, quiet=True))
    # every 20 ms: how long the last message on the page is (what a person watching would see)
    record = (
        "window.__lens = []; setInterval(() => { const m = document.querySelectorAll("
        "'#chatbot [data-testid=\"bot\"]'); if (m.length > 1) window.__lens.push(m[1].innerText.length); }, 20);"
    )
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(WAIT_MS)
            page.goto(url)
            bot, status, box = page.locator("#chatbot"), page.locator("#status"), page.locator("#message textarea")

            box.fill("Tell me a long story.")
            box.press("Enter")
            expect(status).to_contain_text("Context", timeout=60_000)  # the whole reply has been generated
            page.evaluate(record)  # (after the fact: now record the next reply from its start)
            replies = bot.locator('[data-testid="bot"]')
            full = replies.last.inner_text()

            box.fill("And another one.")
            box.press("Enter")
            expect(status).to_contain_text("answering")
            deadline = time.monotonic() + WAIT_MS / 1000  # (wait_for_function would need eval: the CSP says no)
            while len({n for n in page.evaluate("window.__lens") if n > 0}) < 3:  # visibly growing
                assert time.monotonic() < deadline, page.evaluate("window.__lens")
                page.wait_for_timeout(20)
            page.locator("#stop").click()
            expect(status).to_contain_text("Stopped")
            lens = page.evaluate("window.__lens")
            stopped = replies.last.inner_text()
            growing = sorted({n for n in lens if 0 < n < len(stopped)})
            assert len(growing) >= 2, lens  # the reply grew in at least two steps before it was complete
            print(f"page: {len(growing)} growing lengths seen, stopped at {len(stopped)} of {len(full)} characters")
            assert 0 < len(stopped) < len(full)
            bot.get_by_label("Like", exact=True).last.click()  # the stopped reply is rated like any other
            expect(status).to_contain_text("Recorded thumbs up on reply 2")
            browser.close()
    finally:
        app.close()

    tokenizer = AutoTokenizer.from_pretrained(chatty_model)
    (row,) = store.records()
    first = [m["content"] for m in row["turns"] if m["role"] == "assistant"][0]
    second = row["reply"]
    assert first.strip() and len(tokenizer(first)["input_ids"]) >= LONG - 5  # the first ran to max_new_tokens
    assert len(tokenizer(second)["input_ids"]) < LONG / 2  # Stop ended the second well before that
    assert row["verdict"] == "up" and second.split()[0] in stopped  # the stopped reply on the page is the one rated
