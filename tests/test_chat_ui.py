"""The Gradio chat page: its handlers without a browser, then the real page in a real Chromium (Debian's,
driven by Playwright) over a deterministic backend, with ratings and edits checked in a real FeedbackStore."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from dragon_dagster import chat_ui
from dragon_dagster.engine.infer.backends import Backend
from dragon_dagster.engine.infer.chat import Chat
from dragon_dagster.engine.feedback import FeedbackStore

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
WAIT_MS = 20_000  # generous: two shared CPU cores


class Echo(Backend):
    """Deterministic: reply n is "Reply n to: <last user text>"; keeps every conversation it was sent."""

    def __init__(self):
        self.n, self.seen = 0, []

    @property
    def identity(self) -> str:
        return "echo"

    def _chat(self, conversations, *, max_new_tokens, temperature, top_p):
        self.seen.extend(conversations)
        self.n += len(conversations)
        return [f"Reply {self.n} to: {c[-1]['content']}" for c in conversations]


def drain(gen):
    """The last value a streaming handler yields (what the page finally shows)."""
    out = None
    for out in gen:
        pass
    return out


# ----------------------------------------------------------------------------------------- handlers

def test_handlers_turns_feedback_and_transcripts(tmp_path):
    import gradio as gr

    backend, store = Echo(), FeedbackStore(tmp_path / "fb.db")
    h = chat_ui.ChatHandlers(backend, store, "echo-model", stream_delay=0)
    settings = ("Be brief.", 1, 0.7, 64)

    steps = list(h.send("hi", None, *settings))
    assert steps[0][1] == [{"role": "user", "content": "hi"}]  # the user turn shows before the reply
    assert len(steps) >= 3 and steps[-2][1][-1]["content"] in "Reply 1 to: hi"  # then the reply grows
    box, shown, chat, status = steps[-1]
    assert box == "" and shown[-1] == {"role": "assistant", "content": "Reply 1 to: hi"}
    assert chat.system == "Be brief." and chat.context_turns == 1 and chat.max_new_tokens == 64
    for text in ("two", "three"):
        _, shown, chat, status = drain(h.send(text, chat, *settings))
    assert "dropped the 1 oldest" in status
    assert backend.seen[-1] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "two"},
                                {"role": "assistant", "content": "Reply 2 to: two"},
                                {"role": "user", "content": "three"}]

    chat, status = h.like(chat, gr.LikeData(None, {"index": 1, "value": ["Reply 1 to: hi"], "liked": False}))
    assert "thumbs down on reply 1" in status and "echo-model" in status
    chat, status = h.like(chat, gr.LikeData(None, {"index": 0, "value": ["hi"], "liked": True}))
    assert "error" in status  # a user turn is not a reply
    shown, chat, status = drain(h.edit(chat, *settings, data=gr.EditData(
        None, {"index": 3, "value": "Better two.", "previous_value": "Reply 2 to: two"})))
    assert shown[3]["content"] == "Better two." and "edit of reply 2" in status
    rows = store.records()
    assert [(r["verdict"], r["reply"], r["edited"], r["model"]) for r in rows] == [
        ("down", "Reply 1 to: hi", None, "echo-model"), ("edit", "Reply 2 to: two", "Better two.", "echo-model")]
    assert rows[1]["turns"][0] == {"role": "system", "content": "Be brief."}

    # an edited question is asked again, dropping what came after it
    shown, chat, status = drain(h.edit(chat, *settings, data=gr.EditData(
        None, {"index": 4, "value": [{"type": "text", "text": "three!"}], "previous_value": "three"})))
    assert [m["content"] for m in shown[-2:]] == ["three!", "Reply 4 to: three!"] and len(shown) == 6
    shown, chat, status = drain(h.regenerate(chat, *settings))
    assert shown[-1]["content"] == "Reply 5 to: three!"
    box, shown, chat, status = h.undo(chat)
    assert box == "three!" and len(shown) == 4

    update, status = h.save(chat, ".jsonl")
    saved = Path(update["value"])
    assert json.loads(saved.read_text())["messages"][0] == {"role": "system", "content": "Be brief."}
    shown, loaded, system, status = h.load(str(saved), None, "", None, 0.7, 64)
    assert loaded is not chat and loaded.messages == chat.messages and system == "Be brief."
    assert Chat.read_transcript(saved)[1:] == shown

    box, shown, chat, status = h.reset(chat)
    assert shown == [] and chat.messages == [] and store.count() == 2
    assert "error" in drain(h.send("x", None, "", -1, 0.7, 64))[-1]  # a bad window is reported, not raised


# ------------------------------------------------------------------------------------------ browser

@pytest.fixture(scope="session")
def chromium() -> Path:
    """Debian's Chromium (Playwright's own browser download cannot work here), installed when missing."""
    if not CHROMIUM.exists():
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = ["apt-get", "install", "-y", "--no-install-recommends", "chromium"]
        done = subprocess.run(install, capture_output=True, text=True, env=env)
        if done.returncode != 0:  # stale or missing package lists: refresh once and retry
            subprocess.run(["apt-get", "update"], capture_output=True, text=True, env=env)
            done = subprocess.run(install, capture_output=True, text=True, env=env)
        if done.returncode != 0 or not CHROMIUM.exists():
            pytest.fail(f"cannot install chromium with apt-get (rc {done.returncode}):\n{done.stdout[-2000:]}\n"
                        f"{done.stderr[-2000:]}")
    return CHROMIUM


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_chat_page_in_a_real_browser(chromium, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    backend, store = Echo(), FeedbackStore(tmp_path / "feedback.db")
    app = chat_ui.build_app(backend, store, "echo-model", context_turns=1, stream_delay=0.01)
    url = chat_ui.start(app, port=free_port(), block=False, quiet=True)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(WAIT_MS)
            page.goto(url)
            bot = page.locator("#chatbot")
            status = page.locator("#status")
            page.locator("#system textarea").fill("Be brief.")

            def say(text: str, reply: str) -> None:
                page.locator("#message textarea").fill(text)
                page.locator("#message textarea").press("Enter")
                expect(bot.get_by_label(f"bot's message: {reply}")).to_be_visible()
                expect(status).to_contain_text("Context")  # the stream has finished

            say("hello", "Reply 1 to: hello")
            say("second", "Reply 2 to: second")
            bot.get_by_label("Dislike").first.click()  # thumbs down on the first reply
            expect(status).to_contain_text("Recorded thumbs down on reply 1")
            bot.get_by_label("Edit").last.click()  # the last message's pencil: the second reply
            bot.locator("textarea.edit-textarea").fill("A better second reply.")
            bot.get_by_label("Submit").click()
            expect(status).to_contain_text("Recorded edit of reply 2")
            expect(bot.get_by_label("bot's message: A better second reply.")).to_be_visible()
            say("third", "Reply 3 to: third")  # context window 1: the first exchange is left out, and said so
            expect(status).to_contain_text("dropped the 1 oldest")
            page.locator("#regenerate").click()
            expect(bot.get_by_label("bot's message: Reply 4 to: third")).to_be_visible()
            shot = tmp_path / "chat.png"
            page.screenshot(path=str(shot), full_page=True)
            page.locator("#undo").click()
            expect(page.locator("#message textarea")).to_have_value("third")
            page.locator("#save").click()  # a download link to the transcript
            expect(page.locator("#transcript")).to_contain_text(".jsonl")
            old = tmp_path / "old.json"
            old.write_text(json.dumps([{"role": "system", "content": "Talk like a pirate."},
                                       {"role": "user", "content": "ahoy"}, {"role": "assistant", "content": "Arr."}]))
            with page.expect_file_chooser() as chooser:
                page.locator("#load").click()
            chooser.value.set_files(str(old))
            expect(bot.get_by_label("bot's message: Arr.")).to_be_visible()
            expect(page.locator("#system textarea")).to_have_value("Talk like a pirate.")
            browser.close()
    finally:
        app.close()

    rows = store.records()
    assert [(r["verdict"], r["reply"], r["edited"], r["model"]) for r in rows] == [
        ("down", "Reply 1 to: hello", None, "echo-model"),
        ("edit", "Reply 2 to: second", "A better second reply.", "echo-model")]
    system = {"role": "system", "content": "Be brief."}
    assert rows[0]["turns"] == [system, {"role": "user", "content": "hello"}]
    assert rows[1]["turns"] == [system, {"role": "user", "content": "hello"},
                                {"role": "assistant", "content": "Reply 1 to: hello"},
                                {"role": "user", "content": "second"}]
    assert rows[0]["conversation_id"] == rows[1]["conversation_id"]
    # the model continued from the edited reply, with only the last exchange in its context
    assert backend.seen[2] == [system, {"role": "user", "content": "second"},
                               {"role": "assistant", "content": "A better second reply."},
                               {"role": "user", "content": "third"}]
    data = shot.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000
