"""Chat sessions: context, feedback into a real SQLiteFeedbackStore, transcripts, the terminal loop, and one session
over a real loopback HTTP server through ServerBackend."""

from __future__ import annotations

import json

import pytest

from dragon_dagster.engine.data.feedback.sqlite import SQLiteFeedbackStore
from dragon_dagster.engine.data.feedback_rows import preference_pairs, sft_conversations
from dragon_dagster.engine.data.feedback_turns import FeedbackError
from dragon_dagster.engine.data.tables import read_jsonl
from dragon_dagster.engine.infer.backend import Backend, BackendError
from dragon_dagster.engine.infer.chat import Chat
from dragon_dagster.engine.infer.chat_messages import ChatError
from dragon_dagster.engine.infer.server_backend import ServerBackend
from dragon_dagster.terminal_chat import run_terminal
from tests.support import completion


class Scripted(Backend):
    """Deterministic: reply n is "r<n>:<last user text>"; records every conversation and setting it gets."""

    def __init__(self, fail_on: str | None = None):
        self.seen, self.settings, self.n, self.fail_on = [], [], 0, fail_on

    @property
    def identity(self) -> str:
        return "scripted"

    def _chat(self, conversations, *, max_new_tokens, temperature, top_p):
        out = []
        for conversation in conversations:
            self.seen.append(conversation)
            self.settings.append((max_new_tokens, temperature, top_p))
            last = conversation[-1]["content"]
            if self.fail_on and last == self.fail_on:
                raise BackendError("boom")
            self.n += 1
            out.append(f"r{self.n}:{last}")
        return out


def u(text):
    return {"role": "user", "content": text}


def a(text):
    return {"role": "assistant", "content": text}


def test_multi_turn_context_and_settings():
    backend = Scripted()
    chat = Chat(backend, system="Be brief.", max_new_tokens=12, temperature=0.2)
    assert chat.say("hi") == "r1:hi"
    assert chat.say("more") == "r2:more"
    assert backend.seen[1] == [{"role": "system", "content": "Be brief."}, u("hi"), a("r1:hi"), u("more")]
    assert backend.settings[1] == (12, 0.2, 0.9)
    assert chat.history() == [{"role": "system", "content": "Be brief."}, u("hi"), a("r1:hi"), u("more"), a("r2:more")]
    assert chat.model_label == "scripted" and chat.last_dropped == 0
    assert chat.as_example()["completion"] == [a("r2:more")]
    with pytest.raises(ChatError):
        chat.say("  ")
    # a failing backend leaves the history untouched
    failing = Chat(Scripted(fail_on="bad"))
    failing.say("ok")
    with pytest.raises(BackendError):
        failing.say("bad")
    assert failing.history() == [u("ok"), a("r1:ok")]


def test_context_turns_drops_oldest_and_reports():
    backend = Scripted()
    chat = Chat(backend, context_turns=2)
    for text in ("one", "two", "three", "four"):
        chat.say(text)
    assert backend.seen[-1] == [u("two"), a("r2:two"), u("three"), a("r3:three"), u("four")]
    assert chat.last_dropped == 1
    chat.say("five")
    assert chat.last_dropped == 2 and backend.seen[-1][0] == u("three")
    assert chat.context_usage() == {"exchanges": 5, "sent": 3, "dropped": 2, "context_turns": 2}
    assert len(chat.history()) == 10  # the history itself keeps everything
    zero = Chat(Scripted(), context_turns=0)
    zero.say("x")
    zero.say("y")
    assert zero.backend.seen[-1] == [u("y")] and zero.last_dropped == 1
    with pytest.raises(ChatError):
        Chat(Scripted(), context_turns=-1)


def test_rate_and_edit_record_feedback(tmp_path):
    store = SQLiteFeedbackStore(tmp_path / "feedback.sqlite")
    chat = Chat(
        Scripted(), system="sys", model_label="runs/artifacts/p/merged_model/42", store=store, conversation_id="conv-1"
    )
    chat.say("q1")
    chat.say("q2")
    up = chat.rate(True, index=0)
    down = chat.rate("down")
    edit = chat.edit("better answer")
    rows = store.records()
    assert [r["id"] for r in rows] == [up, down, edit]
    assert rows[0]["turns"] == [{"role": "system", "content": "sys"}, u("q1")] and rows[0]["reply"] == "r1:q1"
    assert rows[0]["verdict"] == "up" and rows[1]["verdict"] == "down" and rows[1]["reply"] == "r2:q2"
    assert rows[1]["turns"] == [{"role": "system", "content": "sys"}, u("q1"), a("r1:q1"), u("q2")]
    assert rows[2]["verdict"] == "edit" and rows[2]["reply"] == "r2:q2" and rows[2]["edited"] == "better answer"
    assert {r["model"] for r in rows} == {"runs/artifacts/p/merged_model/42"}
    assert {r["conversation_id"] for r in rows} == {"conv-1"}
    # the edit replaces the reply, and the conversation continues from it
    assert chat.history()[-1] == a("better answer")
    chat.say("q3")
    assert chat.backend.seen[-1][-2:] == [a("better answer"), u("q3")]
    pairs = preference_pairs(rows)
    assert pairs[0]["chosen"] == [a("better answer")] and pairs[0]["rejected"] == [a("r2:q2")]
    assert [c["messages"][-1] for c in sft_conversations(rows)] == [a("r1:q1"), a("better answer")]
    # without a store, feedback is kept on the session only
    bare = Chat(Scripted())
    with pytest.raises(ChatError):
        bare.rate(True)
    bare.say("x")
    assert bare.rate(False) is None and bare.feedback[0]["verdict"] == "down"
    with pytest.raises(ChatError):
        bare.rate(True, index=5)
    with pytest.raises(ChatError):
        bare.edit("")


def test_undo_regenerate_reset():
    chat = Chat(Scripted())
    with pytest.raises(ChatError):
        chat.undo()
    with pytest.raises(ChatError):
        chat.regenerate()
    chat.say("a")
    chat.say("b")
    assert chat.regenerate() == "r3:b"
    assert chat.history() == [u("a"), a("r1:a"), u("b"), a("r3:b")]
    assert chat.backend.seen[-1] == [u("a"), a("r1:a"), u("b")]
    assert chat.undo() == [u("b"), a("r3:b")]
    assert chat.history() == [u("a"), a("r1:a")]
    first_id = chat.conversation_id
    chat.reset()
    assert chat.history() == [] and chat.conversation_id != first_id and chat.last_dropped == 0


@pytest.mark.parametrize("suffix", [".json", ".jsonl"])
def test_save_and_load_round_trip(tmp_path, suffix):
    chat = Chat(Scripted(), system="Be kind.")
    chat.say("hello ü")
    chat.say("again")
    path = chat.save(tmp_path / "t" / f"talk{suffix}")
    if suffix == ".jsonl":
        (row,) = read_jsonl(path)
        assert row == {"messages": chat.history()}  # a one-row conversations dataset
    else:
        assert json.loads(path.read_text()) == chat.history()
    backend = Scripted()
    loaded = Chat.load(path, backend, context_turns=3)
    assert loaded.history() == chat.history() and loaded.system == "Be kind." and loaded.context_turns == 3
    loaded.say("continue")
    assert backend.seen[-1][0] == {"role": "system", "content": "Be kind."} and backend.seen[-1][1] == u("hello ü")
    assert Chat.load(path, backend, system="Other.").history()[0] == {"role": "system", "content": "Other."}


def test_load_message_per_line_and_bad_files(tmp_path):
    lines = tmp_path / "lines.jsonl"
    lines.write_text("\n".join(json.dumps(m) for m in [u("hi"), a("hello")]) + "\n")
    assert Chat.load(lines, Scripted()).history() == [u("hi"), a("hello")]
    bad = tmp_path / "bad.json"
    for text in (
        '{"role": "user"}',
        '[{"role": "robot", "content": "x"}]',
        "not json at all",
        '{"messages": [{"role": "user", "content": "a"}]}\n{"messages": []}\n',
        '[{"role": "user", "content": "a"}, {"role": "system", "content": "late"}]',
    ):
        bad.write_text(text)
        with pytest.raises(ChatError):
            Chat.load(bad, Scripted())


def test_terminal_loop_with_slash_commands(tmp_path):
    store = SQLiteFeedbackStore(tmp_path / "f.sqlite")
    chat = Chat(Scripted(fail_on="explode"), store=store, model_label="m1")
    script = iter(
        [
            "hello",
            "/up",
            "second",
            "/down",
            "/edit a much better reply",
            "/regen",
            "",
            "/undo",
            "/history",
            "/edit",
            "/save",
            f"/save {tmp_path / 'out.json'}",
            "/bogus",
            "explode",
            "//slash text",
            "/help",
            "/reset",
            "/history",
            "/quit",
            "never read",
        ]
    )
    printed = []
    result = run_terminal(
        chat, input_fn=lambda prompt: next(script), print_fn=lambda *a: printed.append(" ".join(str(x) for x in a))
    )
    assert result is chat and next(script) == "never read"
    out = "\n".join(printed)
    assert "r1:hello" in out and "r2:second" in out and "r3:second" in out
    assert "recorded up (feedback #1)" in out and "recorded down" in out and "recorded edit" in out
    assert "usage: /edit" in out and "usage: /save" in out and "unknown command /bogus" in out
    assert "error: boom" in out and "r4:/slash text" in out and "/regen" in out and "(empty)" in out
    assert "[user] hello" in out and "[assistant] r1:hello" in out
    assert [r["verdict"] for r in store.records()] == ["up", "down", "edit"]
    assert store.records()[2]["edited"] == "a much better reply" and store.records()[0]["model"] == "m1"
    assert json.loads((tmp_path / "out.json").read_text()) == [u("hello"), a("r1:hello")]
    assert chat.history() == []
    # end of input ends the loop too
    ended = run_terminal(
        Chat(Scripted()), input_fn=lambda prompt: (_ for _ in ()).throw(EOFError()), print_fn=lambda *a: None
    )
    assert ended.history() == []


def test_chat_over_http_server_backend(stub, tmp_path):
    def respond(n, body):
        users = [m["content"] for m in body["messages"] if m["role"] == "user"]
        return 200, completion(f" answer {n} to {users[-1]} after {len(body['messages'])} messages ")

    server = stub(respond)
    store = SQLiteFeedbackStore(tmp_path / "f.sqlite")
    chat = Chat(ServerBackend(server.url, "served-model"), system="Be brief.", store=store, max_new_tokens=9)
    assert chat.say("hi") == "answer 1 to hi after 2 messages"
    assert chat.say("and?") == "answer 2 to and? after 4 messages"
    body = server.requests[-1]["body"]
    assert body["model"] == "served-model" and body["max_tokens"] == 9 and body["temperature"] == 0.7
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        u("hi"),
        a("answer 1 to hi after 2 messages"),
        u("and?"),
    ]
    chat.rate(True)
    (row,) = store.records()
    assert row["model"] == f"server:{server.url}/chat/completions#served-model" and row["reply"].startswith("answer 2")


class Short(Scripted):
    """Replies that do not echo the user's message back."""

    def _chat(self, conversations, **settings):
        self.seen.extend(conversations)
        return [f"answer {len(c)}" for c in conversations]


def _store_bytes(path) -> int:
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))  # the database, its WAL and shm


def test_long_conversation_is_stored_once_not_per_rating(tmp_path):
    """One 1 MB message then 20 rated exchanges: the old layout stored the 1 MB 21 times (21 MB)."""
    big = "long paste " * 100_000  # 1.1 MB, over the default limit: this store and chat allow 2 MB
    store = SQLiteFeedbackStore(tmp_path / "f.sqlite", max_message_chars=2_000_000)
    chat = Chat(Short(), system="sys", store=store, max_message_chars=2_000_000)
    chat.say(big)
    chat.rate(True)
    for i in range(20):
        chat.say(f"question {i}")
        chat.rate(i % 2 == 0)
    chat.edit("a better last answer")
    rows = store.records()
    assert len(rows) == 22 and all(r["turns"][1]["content"] == big for r in rows)
    assert rows[-1]["turns"] == chat.history()[:-1]
    import sqlite3

    with sqlite3.connect(store.path) as conn:
        assert conn.execute("SELECT COUNT(*) FROM messages WHERE LENGTH(content) >= 1000000").fetchone()[0] == 1
        stored_text = conn.execute("SELECT SUM(LENGTH(content)) FROM messages").fetchone()[0]
    assert stored_text < len(big) + 2_000
    assert _store_bytes(store.path) < 3 * len(big)  # one copy plus page and WAL overhead, not 21 copies
    assert len(sft_conversations(rows)) == 12 and sft_conversations(rows)[0]["messages"][1]["content"] == big


def test_over_long_message_is_refused_with_the_limit(tmp_path):
    store = SQLiteFeedbackStore(tmp_path / "f.sqlite")
    backend = Short()
    chat = Chat(backend, store=store)
    with pytest.raises(ChatError) as caught:
        chat.say("x" * 1_000_000)
    assert str(caught.value) == (
        "the message is 1,000,000 characters long; the limit is 32,000 characters per message (MAX_MESSAGE_CHARS)"
    )
    assert chat.history() == [] and backend.seen == []  # refused before the model saw it
    assert chat.say("y" * 32_000) == "answer 1"  # at the limit is fine
    chat.rate(True)
    # a model reply over the limit is refused by the store when rated, naming it
    echo = Chat(Scripted(), store=store)
    echo.say("y" * 31_999)
    with pytest.raises(FeedbackError, match="the reply is 32,002 characters long; the limit is 32,000"):
        echo.rate(True)
    with pytest.raises(ChatError, match="the edited reply is 32,001 characters long; the limit is 32,000"):
        chat.edit("z" * 32_001)
    chat.system = "s" * 40_000  # the page sets the system prompt directly
    with pytest.raises(ChatError, match="the system prompt is 40,000 characters long"):
        chat.say("hi")
    assert store.count() == 1
    # the terminal prints the refusal and goes on
    printed = []
    script = iter(["w" * 32_001, "/quit"])
    run_terminal(Chat(Scripted(), store=store), input_fn=lambda p: next(script), print_fn=printed.append)
    assert any("error: the message is 32,001 characters long; the limit is 32,000" in line for line in printed)


def test_terminal_streams_to_stdout_by_default(capsys):
    """With the builtin print, replies are written chunk by chunk to stdout (then a newline)."""
    script = iter(["hello", "/regen", "/quit"])
    chat = run_terminal(Chat(Scripted()), input_fn=lambda prompt: next(script))
    out = capsys.readouterr().out
    assert "r1:hello\n" in out and "r2:hello\n" in out and chat.history()[-1] == a("r2:hello")
