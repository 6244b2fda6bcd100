"""The Gradio chat page: its handlers without a browser, then the real page in a real Chromium (Debian's,
driven by Playwright) over a deterministic backend, with ratings and edits checked in a real SQLiteFeedbackStore; and
its defences: a hostile reply stays text, every response has the security headers, the password keeps
strangers out."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urljoin

import pytest

from dragon_dagster import chat_handlers, chat_ui, chat_view
from dragon_dagster.engine.data.feedback.sqlite import SQLiteFeedbackStore
from dragon_dagster.engine.infer.backend import Backend
from dragon_dagster.engine.infer.chat import Chat
from dragon_dagster.page_serving import PageServing, is_loopback
from tests.support import CHROMIUM_ARGS, WAIT_MS, free_port

# Records every Content-Security-Policy violation on the page: the policy must not break Gradio itself.
RECORD_VIOLATIONS = (
    "window.__csp = []; document.addEventListener('securitypolicyviolation', "
    "e => window.__csp.push(e.violatedDirective + ' ' + e.blockedURI));"
)


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


def shown_as_list(out):
    """A handler's outputs with the Chatbot's update (its messages and thumbs) as its messages."""
    if out is None:
        return out
    return tuple(o["value"] if isinstance(o, dict) and "feedback_value" in o else o for o in out)


def thumbs(out):
    """The thumbs a handler's Chatbot update shows, one per bot bubble."""
    return next(o["feedback_value"] for o in out if isinstance(o, dict) and "feedback_value" in o)


def drain(gen, view=False):
    """The last value a streaming handler yields (what the page finally shows); view: the Chatbot's update as
    it is, with its thumbs."""
    out = None
    for out in gen:  # noqa: B007 - the last one is what counts
        pass
    return out if view else shown_as_list(out)


# ----------------------------------------------------------------------------------------- handlers


def test_handlers_turns_feedback_and_transcripts(tmp_path):
    import gradio as gr

    backend, store = Echo(), SQLiteFeedbackStore(tmp_path / "fb.db")
    h = chat_handlers.ChatHandlers(backend, store, "echo-model", stream_delay=0)
    settings = ("Be brief.", 1, 0.7, 64)

    steps = [shown_as_list(step) for step in h.send("hi", None, *settings)]
    assert steps[0][1] == [{"role": "user", "content": "hi"}]  # the user turn shows before the reply
    assert len(steps) >= 3 and steps[-2][1][-1]["content"] in "Reply 1 to: hi"  # then the reply grows
    box, shown, chat, status = steps[-1]
    assert box == "" and shown[-1] == {"role": "assistant", "content": "Reply 1 to: hi"}
    assert chat.system == "Be brief." and chat.context_turns == 1 and chat.max_new_tokens == 64
    for text in ("two", "three"):
        _, shown, chat, status = drain(h.send(text, chat, *settings))
    assert "sent the last exchange; **dropped the oldest**" in status
    assert backend.seen[-1] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "two"},
        {"role": "assistant", "content": "Reply 2 to: two"},
        {"role": "user", "content": "three"},
    ]

    _, chat, status = h.like(chat, gr.LikeData(None, {"index": 1, "value": ["Reply 1 to: hi"], "liked": False}))
    assert "thumbs down on reply 1" in status and "echo-model" in status
    _, chat, status = h.like(chat, gr.LikeData(None, {"index": 0, "value": ["hi"], "liked": True}))
    assert "error" in status  # a user turn is not a reply
    shown, chat, status = drain(
        h.edit(
            chat,
            *settings,
            data=gr.EditData(None, {"index": 3, "value": "Better two.", "previous_value": "Reply 2 to: two"}),
        )
    )
    assert shown[3]["content"] == "Better two." and "edit of reply 2" in status
    rows = store.records()
    assert [(r["verdict"], r["reply"], r["edited"], r["model"]) for r in rows] == [
        ("down", "Reply 1 to: hi", None, "echo-model"),
        ("edit", "Reply 2 to: two", "Better two.", "echo-model"),
    ]
    assert rows[1]["turns"][0] == {"role": "system", "content": "Be brief."}

    # an edited question is asked again, dropping what came after it
    shown, chat, status = drain(
        h.edit(
            chat,
            *settings,
            data=gr.EditData(
                None, {"index": 4, "value": [{"type": "text", "text": "three!"}], "previous_value": "three"}
            ),
        )
    )
    assert [m["content"] for m in shown[-2:]] == ["three!", "Reply 4 to: three!"] and len(shown) == 6
    shown, chat, status = drain(h.regenerate(chat, *settings))
    assert shown[-1]["content"] == "Reply 5 to: three!"
    box, shown, chat, status = shown_as_list(h.undo(chat))
    assert box == "three!" and len(shown) == 4

    update, status = h.save(chat, ".jsonl")
    saved = Path(update["value"])
    assert json.loads(saved.read_text())["messages"][0] == {"role": "system", "content": "Be brief."}
    shown, loaded, system, status = shown_as_list(h.load(str(saved), None, "", None, 0.7, 64))
    assert loaded is not chat and loaded.history() == chat.history() and system == "Be brief."  # no ratings: a
    # transcript is a new conversation
    assert Chat.read_transcript(saved)[1:] == shown

    box, shown, chat, status = h.reset(chat)
    assert shown == [] and chat.messages == [] and store.count() == 2
    assert "error" in drain(h.send("x", None, "", -1, 0.7, 64))[-1]  # a bad window is reported, not raised


def test_a_rating_shows_counts_once_and_survives_a_reload_and_an_edit(tmp_path):
    """Traced into a real MLflow store: Like, reload, Like again stores one rating; a changed verdict is a new
    record, and an assessment on the reply's trace, that the feedback datasets take over the old one (both kept).
    The thumbs show after a reload and after an edit of another reply; a turn after the reload is traced, and
    ratings after it reach their traces."""
    import gradio as gr
    from mlflow import MlflowClient

    from dragon_dagster.engine.data.feedback_rows import unpaired_ratings
    from dragon_dagster.engine.infer.tracing import THUMBS, ChatTracer

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    tracer = ChatTracer(uri, client.create_experiment("chat", artifact_location=str(tmp_path / "traces")), user="ana")
    store = SQLiteFeedbackStore(tmp_path / "fb.db")
    h = chat_handlers.ChatHandlers(Echo(), store, "echo", stream_delay=0, tracer=tracer)
    chat = drain(h.send("one", None, "", None, 0.7, 64))[2]
    chat = drain(h.send("two", chat, "", None, 0.7, 64))[2]
    first = chat.messages[1]["trace_id"]
    like = gr.LikeData(None, {"index": 1, "value": ["Reply 1 to: one"], "liked": True})
    _, chat, status = h.like(chat, like)
    assert "Recorded thumbs up on reply 1 (feedback #1" in status
    _, chat, status = h.like(chat, like)
    assert status == "Thumbs up on reply 1 is already recorded (feedback #1): a rating counts once."
    assert store.count() == 1
    view, chat, status = h.like(chat, gr.LikeData(None, {"index": 1, "value": ["x"], "liked": None}))  # un-clicked
    assert view["feedback_value"] == ["Like", None] and "stays" in status and store.count() == 1  # shown again

    kept = json.loads(json.dumps(h.remember(chat)))  # a reload: what the browser kept, in a new session
    kept["messages"][3]["trace_id"] = "../not-a-trace"  # what a browser sends back is checked
    view, restored, _, _ = h.restore(kept, None)
    assert restored.tracer is tracer and restored.messages[1]["trace_id"] == first
    assert "trace_id" not in restored.messages[3] and view["feedback_value"] == ["Like", None]
    _, restored, status = h.like(restored, like)
    assert "already recorded (feedback #1)" in status and store.count() == 1
    _, restored, status = h.like(restored, gr.LikeData(None, {"index": 1, "value": ["x"], "liked": False}))
    assert "Recorded thumbs down on reply 1, replacing thumbs up (feedback #2" in status
    _, _, restored, _ = drain(h.send("three", restored, "", None, 0.7, 64))  # traced after the reload too
    third = restored.messages[5]["trace_id"]
    _, restored, status = h.like(restored, gr.LikeData(None, {"index": 5, "value": ["x"], "liked": True}))
    edited = drain(
        h.edit(
            restored, "", None, 0.7, 64, data=gr.EditData(None, {"index": 3, "value": "Better.", "previous_value": ""})
        ),
        view=True,
    )
    assert thumbs(edited) == ["Dislike", None, "Like"]  # the other replies' thumbs stay on the page
    records = store.records()
    assert [(r["verdict"], r["trace_id"]) for r in records] == [
        ("up", first),
        ("down", first),
        ("up", third),
        ("edit", None),
    ]
    assert [row["label"] for row in unpaired_ratings(records[:2])] == [False]  # the latest verdict counts
    verdicts = [a.value for a in client.get_trace(first).info.assessments if a.name == THUMBS]
    assert sorted(verdicts) == [False, True]  # each rating once, on its reply's trace
    assert [a.value for a in client.get_trace(third).info.assessments if a.name == THUMBS] == [True]


def test_tool_calls_and_results_show_as_blocks_and_only_answers_are_rated(tmp_path):
    """With the pipeline's tools, a turn's call and result are titled blocks of their own (one Chatbot message per
    chat message, so thumbs land on the right turn), only the answer takes thumbs and edits, and the feedback and
    the browser's copy keep the tool turns."""
    import gradio as gr

    from dragon_dagster.engine.tools.declare import Tools, Toolset
    from tests.engine.infer.test_chat_tools import ORDERS, RESULT, Caller

    (tmp_path / "tools.py").write_text(ORDERS.format(counter=str(tmp_path / "calls.txt")))
    toolset = Toolset.from_settings(Tools(file=str(tmp_path / "tools.py")))
    store = SQLiteFeedbackStore(tmp_path / "fb.db")
    h = chat_handlers.ChatHandlers(Caller(), store, "caller", stream_delay=0, toolset=toolset)
    _, shown, chat, status = drain(h.send("Where is A1042?", None, "", None, 0.0, 64))
    assert shown == [
        {"role": "user", "content": "Where is A1042?"},
        {"role": "assistant", "content": "Looking.", "metadata": {"title": '-> order_status({"order_id": "A1042"})'}},
        {"role": "assistant", "content": shown[2]["content"], "metadata": {"title": "order_status answered"}},
        {"role": "assistant", "content": "It shipped."},
    ]
    assert chat_view.unshown(shown[2]["content"]) == RESULT and status.startswith("Context")
    assert (tmp_path / "calls.txt").read_text() == "A1042\n"
    for block in (1, 2):  # a call or a result is not an answer to rate or edit
        _, _, status = h.like(chat, gr.LikeData(None, {"index": block, "value": ["x"], "liked": True}))
        assert "error" in status and "only answers are rated" in status
        edited = drain(
            h.edit(
                chat, "", None, 0.0, 64, data=gr.EditData(None, {"index": block, "value": "y", "previous_value": "x"})
            )
        )
        assert "error" in edited[-1] and len(chat.messages) == 4
    _, chat, status = h.like(chat, gr.LikeData(None, {"index": 3, "value": ["It shipped."], "liked": True}))
    assert "thumbs up on reply 1" in status
    [record] = store.records()
    assert [m["role"] for m in record["turns"]] == ["user", "assistant", "tool"]
    assert record["turns"][1]["tool_calls"][0]["function"]["name"] == "order_status"
    # the browser keeps the tool turns, and a reload continues with them and the tools
    restored = shown_as_list(h.restore(h.remember(chat), None))
    assert restored[0] == shown and restored[1].messages == chat.messages and restored[1].toolset is toolset


def test_the_context_window_box_all_or_a_number():
    """The box shows "all" for the whole conversation; what it sends back becomes Chat.context_turns."""
    assert (
        chat_view.window_value(None) == "all" and chat_view.window_value(0) == "0" and chat_view.window_value(3) == "3"
    )
    for value, turns in (
        (None, None),
        ("", None),
        ("all", None),
        (" All ", None),
        ("0", 0),
        (0, 0),
        (0.0, 0),
        (" 2 ", 2),
        (5, 5),
    ):
        assert chat_view.window_turns(value) == turns, value
    for bad in (-1, "-1", "1.5", 1.5, "two", "nan", "1e3"):
        with pytest.raises(chat_handlers.ChatError, match="all or a whole number"):
            chat_view.window_turns(bad)

    backend = Echo()
    h = chat_handlers.ChatHandlers(backend, None, "echo", stream_delay=0)
    chat = drain(h.send("My name is Ada.", None, "", "all", 0.7, 64))[2]
    status = drain(h.send("What is my name?", chat, "", "all", 0.7, 64))[-1]
    assert (
        backend.seen[-1][0] == {"role": "user", "content": "My name is Ada."}
        and "the earlier exchange was sent" in status
    )
    status = drain(h.send("And now?", chat, "", "0", 0.7, 64))[-1]  # a typed 0: no earlier exchange
    assert backend.seen[-1] == [{"role": "user", "content": "And now?"}] and "dropped the 2 oldest" in status


class Words(Echo):
    """Streams "w1 w2 ... w8" word by word, checking the stop event before each word (as a model does per token)."""

    before_first = None  # called when the request starts (a Stop click while the model reads the prompt)

    def _stream(self, conversation, *, max_new_tokens, temperature, top_p, stop):
        self.seen.append(conversation)
        if self.before_first:
            self.before_first()
        for i in range(1, 9):
            if stop.is_set():
                return
            yield f"w{i} "


def test_handlers_stream_chunks_and_stop_keeps_the_reply(tmp_path):
    import gradio as gr

    store = SQLiteFeedbackStore(tmp_path / "fb.db")
    h = chat_handlers.ChatHandlers(Words(), store, "words", stream_delay=0)
    settings = ("", None, 0.7, 64)
    steps = [shown_as_list(step) for step in h.send("go", None, *settings)]
    growing = [shown[-1]["content"] for _, shown, _, status in steps if status == chat_view.ANSWERING]
    assert growing == [" ".join(f"w{i}" for i in range(1, n + 1)) for n in range(1, 9)]  # one update per chunk
    box, shown, chat, status = steps[-1]
    assert shown[-1]["content"] == "w1 w2 w3 w4 w5 w6 w7 w8" and "Context" in status and not chat.is_stopped()

    turn = h.send("again", chat, *settings)
    for box, shown, chat, status in map(shown_as_list, turn):  # noqa: B007 - the last update's box and status are checked below
        if shown[-1]["content"] == "w1 w2":
            h.stop(chat)  # what the Stop button does, while the turn's handler is streaming
    assert shown[-1] == {"role": "assistant", "content": "w1 w2"} and "Stopped" in status and box == ""
    assert chat.is_stopped() and chat.active is None
    _, chat, status = h.like(chat, gr.LikeData(None, {"index": 3, "value": ["w1 w2"], "liked": True}))
    assert "Recorded thumbs up on reply 2" in status
    shown, chat, status = drain(
        h.edit(
            chat,
            *settings,
            data=gr.EditData(None, {"index": 3, "value": "w1 w2 and the rest", "previous_value": "w1 w2"}),
        )
    )
    assert "edit of reply 2" in status and not chat.is_stopped()
    assert [(r["verdict"], r["reply"], r["edited"]) for r in store.records()] == [
        ("up", "w1 w2", None),
        ("edit", "w1 w2", "w1 w2 and the rest"),
    ]

    # regenerate streams too; stopped before its first word, the old reply stays
    regen = h.regenerate(chat, *settings)
    first = shown_as_list(next(regen))
    assert first[0][-1]["content"] == "w1" and first[2] == chat_view.ANSWERING
    assert drain(regen)[0][-1]["content"] == "w1 w2 w3 w4 w5 w6 w7 w8"
    chat.stream_regenerate()  # made but never read: nothing changes
    regen = h.regenerate(chat, *settings)
    h.stop(chat)  # nothing is being generated yet: a no-op
    h.stop(None)
    assert drain(regen)[0][-1]["content"] == "w1 w2 w3 w4 w5 w6 w7 w8"
    # a question stopped before any text goes back into the box, and the history is as it was
    before = list(chat.messages)
    h.backend.before_first = lambda: h.stop(chat)
    box, shown, chat, status = drain(h.send("third", chat, *settings))
    assert box == "third" and "Stopped before the model wrote anything" in status and chat.messages == before


def test_shown_keeps_markdown_and_makes_html_images_and_diagrams_inert():
    hostile = (
        '<form action="http://127.0.0.1:9/x"><input type="password"></form> <img src="http://x/p"> '
        "<script>alert(1)</script> <!-- c --> <?php ?> <http://auto.link> </b> ![i](http://x/p) "
        '&lt;b&gt; &#60;i&#62; &amp;\n```mermaid\ngraph TD; A["<img src=x>"]\n```'
    )
    safe = chat_view.shown(hostile)
    assert "<" not in safe.replace("< ", "") and "![" not in safe and "```mermaid" not in safe
    assert re.findall(r"&#?\w+;", safe) == re.findall(r"&#(?:38|60|91|109);", safe)  # every reference is ours
    plain = "**Bold**, `code`, a < b && c > d, [a link](http://x), ! [not an image], 5 > 3\n> quoted\n- item"
    assert chat_view.shown(plain) == plain  # ordinary Markdown and comparisons pass untouched
    for text in (hostile, plain, "&#38;#60;", "!&#91;", "```&#109;ermaid", "&#1114112; &#99999999999;", ""):
        assert chat_view.unshown(chat_view.shown(text)) == text  # the way back is exact (edits keep the original)

    # the handlers: everything the Chatbot gets is shown(); what an edit sends back is the original text
    class Hostile(Echo):
        def _chat(self, conversations, **kw):
            return [hostile for _ in conversations]

    h = chat_handlers.ChatHandlers(Hostile(), None, "m", stream_delay=0)
    steps = [shown_as_list(step) for step in h.send("<b>me</b>", None, "", None, 0.7, 64)]
    assert all("<" not in m["content"].replace("< ", "") for _, shown, _, _ in steps for m in shown)
    chat = steps[-1][2]
    assert chat.messages == [{"role": "user", "content": "<b>me</b>"}, {"role": "assistant", "content": hostile}]
    import gradio as gr

    _, chat, status = drain(
        h.edit(
            chat,
            "",
            None,
            0.7,
            64,
            data=gr.EditData(
                None, {"index": 1, "value": chat_view.shown(hostile) + " <i>ok</i>", "previous_value": ""}
            ),
        )
    )
    assert chat.messages[1]["content"] == hostile + " <i>ok</i>" and "edit of reply 1" in status
    assert chat_view.error_line(ValueError("<img src=x>")) == "**error:** &#60;img src=x>"


def test_the_status_line_counts_earlier_exchanges_in_words():
    """No "all 0 earlier exchange(s)": the first exchange says so, and one is one, not one(s)."""
    backend = Echo()
    h = chat_handlers.ChatHandlers(backend, None, "echo", stream_delay=0)
    said = []
    chat = None
    for n in range(4):
        _, _, chat, status = drain(h.send(f"m{n}", chat, "", "all", 0.7, 64))
        said.append(status)
    assert said == [
        "Context: the first exchange, nothing earlier to send.",
        "Context: the earlier exchange was sent.",
        "Context: all 2 earlier exchanges sent.",
        "Context: all 3 earlier exchanges sent.",
    ]
    for window, expected in (
        ("2", "Context window 2: sent the last 2 exchanges; **dropped the 2 oldest**."),
        ("1", "Context window 1: sent the last exchange; **dropped the 4 oldest**."),
        ("0", "Context window 0: sent no earlier exchange; **dropped the 6 oldest**."),
    ):
        assert drain(h.send("more", chat, "", window, 0.7, 64))[-1] == expected
    assert drain(h.send("one more", chat, "", "6", 0.7, 64))[-1].endswith("**dropped the oldest**.")
    assert not any("(s)" in line for line in said)
    assert h.undo(chat)[-1] == "Removed 2 messages."
    assert chat_view.plural(1, "message") == "1 message" and chat_view.plural(0, "message") == "0 messages"


def test_the_conversation_kept_in_the_browser_comes_back(tmp_path):
    """What the page keeps in the browser's storage (ChatHandlers.remember) continues there after a reload
    (restore): same messages, system prompt and conversation id, so feedback given after the reload joins the
    same conversation. What comes back from the browser is checked like a transcript."""
    import gradio as gr

    store = SQLiteFeedbackStore(tmp_path / "fb.db")
    h = chat_handlers.ChatHandlers(Echo(), store, "echo", stream_delay=0)
    assert h.remember(None)["messages"] == []  # no conversation (a kept one that did not restore): an empty one
    chat = drain(h.send("hello", None, "Be brief.", None, 0.7, 64))[2]
    chat = drain(h.send("again", chat, "Be brief.", None, 0.7, 64))[2]
    kept = json.loads(json.dumps(h.remember(chat)))  # the browser stores JSON
    assert kept["system"] == "Be brief." and len(kept["messages"]) == 4

    shown, restored, system, status = shown_as_list(h.restore(kept, None))  # a reload: a new session, no Chat yet
    assert restored is not chat and restored.messages == chat.messages and system == "Be brief."
    assert restored.conversation_id == chat.conversation_id and shown == chat_view.display(chat.messages)
    assert status == "Continuing this conversation (4 messages)."
    restored.rate(True, index=0)
    assert store.records()[0]["conversation_id"] == chat.conversation_id
    # a session that has its Chat (the stored value changed because a turn wrote it), or nothing kept: no change
    for value, session in ((kept, chat), (None, None), ({"messages": []}, None)):
        assert all(isinstance(out, type(gr.skip())) for out in h.restore(value, session))
    # a cleared conversation is kept as empty, and restores as nothing
    h.reset(chat)
    assert h.remember(chat)["messages"] == [] and h.restore(h.remember(chat), None)[1] == gr.skip()

    # bad values: said on the status line, and a new conversation starts
    for bad, why in (
        ("text", "expected a mapping"),
        ({"messages": "hi"}, "expected a list of chat messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "must be a dict with a role"),
        ({"messages": [{"role": "user", "content": "x"}, {"role": "system", "content": "y"}]}, "may only come first"),
        ({"messages": [{"role": "user", "content": "x"}], "system": 3}, "system prompt must be text"),
    ):
        *unchanged, status = h.restore(bad, None)
        assert all(isinstance(out, type(gr.skip())) for out in unchanged), bad
        assert status.startswith("**error:** the conversation kept in this browser") and why in status, status
        assert "starting a new conversation" in status
    *_, status = h.reset(None)  # Clear after that: the browser then keeps an empty conversation
    assert status == "New conversation." and h.restore(h.remember(None), None)[-1] == gr.skip()
    made_up = {"conversation_id": "../../etc", "messages": [{"role": "user", "content": "x"}]}
    assert h.restore(made_up, None)[1].conversation_id != "../../etc"  # an id the browser made up is not used


def test_the_page_layout_names_the_model_with_one_of_each_control():
    """The header shows the model's name (not its directory); one Regenerate, Undo and Clear each (no retry or
    undo icons on the Chatbot; Clear is its own icon); Stop hidden until a reply is being generated; the
    conversation kept in the browser's storage."""
    import gradio as gr

    name = "models:/support@champion (version 3)"
    app = chat_ui.build_app(Echo(), None, "/runs/artifacts/support/merged_model/x/model", name)
    blocks = list(app.blocks.values())
    header = next(b for b in blocks if b.elem_id == "header")
    assert f"Chat with `{name}`" in header.value and "/runs/" not in header.value and app.title.endswith(name)
    labels = sorted(b.value for b in blocks if isinstance(b, gr.Button))
    assert labels == sorted(["Send", "Stop", "↻ Regenerate", "↶ Undo", "Save transcript"]), labels
    stop = next(b for b in blocks if b.elem_id == "stop")
    assert stop.visible is False
    chatbot = next(b for b in blocks if b.elem_id == "chatbot")
    assert not getattr(chatbot, "_retryable", False) and not getattr(chatbot, "_undoable", False)
    listened = {(t[1]) for fn in app.fns.values() for t in fn.targets if t[0] == chatbot._id}
    assert listened == {"like", "edit", "clear"}, listened  # no retry / undo icons on the Chatbot (Clear: its own)
    assert any(isinstance(b, gr.BrowserState) for b in blocks)
    # without a name, the label (what feedback records) is the header
    plain = chat_ui.build_app(Echo(), None, "echo-model")
    assert "Chat with `echo-model`" in next(b for b in plain.blocks.values() if b.elem_id == "header").value


def test_the_cli_names_the_deployed_model_by_its_registry_name(monkeypatch, tmp_path):
    """`dragon chat-ui` tells the page the champion's registry name, or that the model is the latest merged one
    and not yet promoted; feedback still records the model's directory."""
    from click.testing import CliRunner

    from dragon_dagster.cli import main
    from dragon_dagster.engine.release import model_registry

    calls = []
    monkeypatch.setattr(chat_ui, "launch", lambda *a, **kw: calls.append(kw))
    monkeypatch.setenv("DRAGON_RUNS_DIR", str(tmp_path))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)

    def run(*args):
        return CliRunner().invoke(main, ["chat-ui", "--system", "", *args])

    out = run()
    assert out.exit_code != 0 and "no champion" in out.output and not calls  # neither: said, nothing served
    merged = tmp_path / "artifacts" / "support" / "merged_model" / "20250101-120000-abc"
    (merged / "model").mkdir(parents=True)
    out = run()
    assert out.exit_code == 0, out.output
    assert calls[-1]["model_name"] == "latest merged model (not yet promoted): 20250101-120000-abc"
    assert calls[-1]["model_label"] == str(merged / "model")
    assert "latest merged model (not yet promoted)" in out.output
    for named in (("support",), ("--pipeline", "support")):  # the pipeline as the first argument, as people type it
        out = run(*named)
        assert out.exit_code == 0 and calls[-1]["model_label"] == str(merged / "model"), out.output
    out = run("support", "--pipeline", "orders")
    assert out.exit_code != 0 and "name it once" in out.output

    champion = tmp_path / "champion"
    monkeypatch.setattr(
        model_registry, "alias_version", lambda client, name, alias: "3" if alias == "champion" else None
    )
    monkeypatch.setattr(model_registry, "model_dir", lambda client, ref, cache: champion)
    for args in ((), ("--model", "models:/support@champion")):
        out = run(*args)
        assert out.exit_code == 0, out.output
        assert calls[-1]["model_name"] == "models:/support@champion (version 3)", args
        assert calls[-1]["model_label"] == str(champion) and "models:/support@champion (version 3)" in out.output
    run("--model", "models:/support/2")
    assert calls[-1]["model_name"] == "models:/support/2"


def test_exposure_warning_and_the_cli_password(monkeypatch, tmp_path):
    from click.testing import CliRunner

    from dragon_dagster.cli import main

    assert all(is_loopback(h) for h in ("127.0.0.1", "127.0.0.2", "localhost", "::1", "[::1]"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "192.168.1.5", "example.org", ""))
    assert chat_ui.exposure_warning("127.0.0.1", None) is None
    assert chat_ui.exposure_warning("0.0.0.0", "pw") is None
    assert "promoted automatically" in chat_ui.exposure_warning("0.0.0.0", None)
    assert "share link" in chat_ui.exposure_warning("127.0.0.1", None, share=True)

    calls = []
    monkeypatch.setattr(chat_ui, "launch", lambda *a, **kw: calls.append(kw))
    monkeypatch.setenv("DRAGON_RUNS_DIR", str(tmp_path))

    def run(*args, env=None):
        return CliRunner().invoke(main, ["chat-ui", "--model", "http://127.0.0.1:9/v1", *args], env=env)

    out = run()  # today's default: loopback, no password, no warning
    assert out.exit_code == 0 and "warning:" not in out.output and calls[-1]["serving"].password is None
    out = run("--host", "0.0.0.0")
    assert out.exit_code == 0 and "warning:" in out.output and "promoted automatically" in out.output
    secret = "correct horse battery"
    out = run("--host", "0.0.0.0", "--password-env", "CHAT_PW", "--username", "ops", env={"CHAT_PW": secret})
    assert out.exit_code == 0 and "warning:" not in out.output and secret not in out.output
    serving = calls[-1]["serving"]
    assert (serving.password, serving.username, serving.host) == (secret, "ops", "0.0.0.0")
    n = len(calls)
    out = run("--password-env", "CHAT_PW_UNSET", env={"CHAT_PW_UNSET": ""})
    assert out.exit_code != 0 and "CHAT_PW_UNSET" in out.output and len(calls) == n  # never served open instead


# ------------------------------------------------------------------------------------------ browser


def send(page, text: str, reply: str) -> None:
    """Type a message on the chat page and wait until the whole reply is on it (the status line then says what
    context was sent)."""
    from playwright.sync_api import expect

    page.locator("#message textarea").fill(text)
    page.locator("#message textarea").press("Enter")
    expect(page.locator("#chatbot").get_by_label(f"bot's message: {reply}")).to_be_visible()
    expect(page.locator("#status")).to_contain_text("Context")


def assert_security_headers(response) -> None:
    csp = response.headers.get("Content-Security-Policy", "")
    assert "default-src 'self'" in csp and "form-action 'self'" in csp and "frame-ancestors 'none'" in csp
    assert "img-src 'self' data: blob:" in csp and "http" not in csp  # no outside source of anything
    assert response.headers.get("X-Frame-Options") == "DENY"
    assert response.headers.get("X-Content-Type-Options") == "nosniff"


class Pixel:
    """A real HTTP server on loopback that records every request: the tracking pixel a reply points at."""

    def __init__(self):
        self.hits = hits = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                hits.append(self.path)
                self.send_response(200)
                self.send_header("Content-Type", "image/gif")
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_POST = do_GET

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class Slow(SQLiteFeedbackStore):
    """A SQLiteFeedbackStore whose writes take `delay` seconds (a busy database): a thumb clicked while another is still
    being recorded."""

    delay = 0.0

    def record(self, *args, **kwargs):
        threading.Event().wait(self.delay)
        return super().record(*args, **kwargs)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_chat_page_in_a_real_browser(chromium, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    backend, store = Echo(), Slow(tmp_path / "feedback.db")
    app = chat_ui.build_app(backend, store, "echo-model", context_turns=1, stream_delay=0.01)
    url = chat_ui.start(app, PageServing(port=free_port(), block=False, quiet=True))
    try:
        import requests

        assert_security_headers(requests.get(url, timeout=10))  # no password (the default): open on loopback
        assert requests.get(url + "config", timeout=10).status_code == 200
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(WAIT_MS)
            page.add_init_script(RECORD_VIOLATIONS)
            page.goto(url)
            bot = page.locator("#chatbot")
            status = page.locator("#status")
            page.locator("#system textarea").fill("Be brief.")

            send(page, "hello", "Reply 1 to: hello")
            clear, first = (
                loc.bounding_box() for loc in (page.get_by_label("Clear"), bot.locator(".message-row").first)
            )
            assert clear["y"] + clear["height"] <= first["y"]  # the Clear icon sits above the first message
            send(page, "second", "Reply 2 to: second")
            # thumbs down on the first reply and, while that is still being written, up on the second: both count
            # (a click made while another rating is in flight was once dropped by the page, with nothing said)
            store.delay = 1.5
            bot.get_by_label("Dislike").first.click()
            bot.locator(".message-buttons-left").nth(1).get_by_label("Like", exact=True).click()
            expect(status).to_contain_text("Recorded thumbs up on reply 2")
            store.delay = 0.0
            for pencil in bot.locator(".message-buttons-right").get_by_label("Edit").all():
                expect(pencil).to_be_hidden()  # a pencil on replies only: they are what an edit teaches
            bot.get_by_label("Edit").last.click()  # the last message's pencil: the second reply
            box, conversation = (
                loc.bounding_box() for loc in (bot.locator("textarea.edit-textarea"), bot.locator(".bubble-wrap"))
            )
            assert box["width"] > conversation["width"] / 2  # as wide as the conversation, not as the reply
            bot.locator("textarea.edit-textarea").fill("A better second reply.")
            bot.get_by_label("Submit").click()
            expect(status).to_contain_text("Recorded edit of reply 2")
            expect(bot.get_by_label("bot's message: A better second reply.")).to_be_visible()
            send(page, "third", "Reply 3 to: third")  # context window 1: the first exchange is left out, and said so
            expect(status).to_contain_text("dropped the oldest")
            page.locator("#regenerate").click()
            expect(bot.get_by_label("bot's message: Reply 4 to: third")).to_be_visible()
            shot = tmp_path / "chat.png"
            page.screenshot(path=str(shot), full_page=True)
            page.locator("#undo").click()
            expect(page.locator("#message textarea")).to_have_value("third")
            page.locator("#save").click()  # a download link to the transcript
            expect(page.locator("#transcript")).to_contain_text(".jsonl")
            old = tmp_path / "old.json"
            old.write_text(
                json.dumps(
                    [
                        {"role": "system", "content": "Talk like a pirate."},
                        {"role": "user", "content": "ahoy"},
                        {"role": "assistant", "content": "Arr."},
                    ]
                )
            )
            with page.expect_file_chooser() as chooser:
                page.locator("#load").click()
            chooser.value.set_files(str(old))
            expect(bot.get_by_label("bot's message: Arr.")).to_be_visible()
            expect(page.locator("#system textarea")).to_have_value("Talk like a pirate.")
            assert page.evaluate("window.__csp") == []  # the whole session ran under the policy
            browser.close()
    finally:
        app.close()

    rows = store.records()
    assert [(r["verdict"], r["reply"], r["edited"], r["model"]) for r in rows] == [
        ("down", "Reply 1 to: hello", None, "echo-model"),
        ("up", "Reply 2 to: second", None, "echo-model"),
        ("edit", "Reply 2 to: second", "A better second reply.", "echo-model"),
    ]
    system = {"role": "system", "content": "Be brief."}
    assert rows[0]["turns"] == [system, {"role": "user", "content": "hello"}]
    assert (
        rows[1]["turns"]
        == rows[2]["turns"]
        == [
            system,
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": "Reply 1 to: hello"},
            {"role": "user", "content": "second"},
        ]
    )
    assert rows[0]["conversation_id"] == rows[2]["conversation_id"]
    # the model continued from the edited reply, with only the last exchange in its context
    assert backend.seen[2] == [
        system,
        {"role": "user", "content": "second"},
        {"role": "assistant", "content": "A better second reply."},
        {"role": "user", "content": "third"},
    ]
    data = shot.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000


class Held(Words):
    """Words, but with `hold` set a reply waits after its first word until `release` is set (or Stop)."""

    def __init__(self):
        super().__init__()
        self.hold, self.release = False, threading.Event()

    def _stream(self, conversation, *, max_new_tokens, temperature, top_p, stop):
        for i, word in enumerate(
            super()._stream(
                conversation, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, stop=stop
            )
        ):
            if i == 1 and self.hold:
                while not self.release.wait(0.05):
                    if stop.is_set():
                        return
            yield word


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_reload_keeps_the_conversation_one_of_each_control_stop_only_while_answering_in_a_real_browser(
    chromium, tmp_path
):
    """In a real Chromium: the header names the model; one Regenerate, Undo and Clear; Stop hidden when idle,
    shown while a reply is generated, and it still stops it; a reload finds the conversation (and the system
    prompt) still there with its thumbs, a thumb clicked again records nothing, ratings, edits and turns after it
    join the same conversation and are traced into MLflow (a trace per turn, an assessment per rating and edit),
    the model gets the whole history; Clear and a reload: empty."""
    from mlflow import MlflowClient
    from playwright.sync_api import expect, sync_playwright

    from dragon_dagster.engine.infer.tracing import EDITED, THUMBS, ChatTracer

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("chat", artifact_location=str(tmp_path / "traces"))
    backend, store = Held(), SQLiteFeedbackStore(tmp_path / "feedback.db")
    name = "models:/support@champion (version 3)"
    app = chat_ui.build_app(
        backend, store, "/runs/x/model", name, stream_delay=0.01, tracer=ChatTracer(uri, experiment)
    )
    url = chat_ui.start(app, PageServing(port=free_port(), block=False, quiet=True))
    whole = "w1 w2 w3 w4 w5 w6 w7 w8"
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(WAIT_MS)
            page.goto(url)
            bot, status, stop = page.locator("#chatbot"), page.locator("#status"), page.locator("#stop")
            expect(page.locator("#header")).to_contain_text(f"Chat with {name}")
            expect(page.locator("#header")).not_to_contain_text("/runs/")
            expect(stop).to_be_hidden()
            page.locator("#system textarea").fill("Be brief.")

            send(page, "hello", whole)
            expect(status).to_have_text("Context: the first exchange, nothing earlier to send.")
            expect(stop).to_be_hidden()
            for control in ("regenerate|retry", "undo", "clear"):  # with a reply on the page, where the
                buttons = page.get_by_role("button", name=re.compile(control, re.I))  # Chatbot's own show
                expect(buttons).to_have_count(1)
            bot.get_by_label("Like", exact=True).first.click()
            expect(status).to_contain_text("Recorded thumbs up on reply 1")

            backend.hold = True  # the next reply waits after its first word: Stop is there while it does
            page.locator("#message textarea").fill("second")
            page.locator("#message textarea").press("Enter")
            expect(bot.get_by_label("bot's message: w1", exact=True)).to_be_visible()
            expect(stop).to_be_visible()
            stop.click()
            expect(status).to_contain_text("Stopped")
            expect(stop).to_be_hidden()
            backend.hold = False

            page.reload()
            expect(bot.get_by_label("user's message: hello")).to_be_visible()
            expect(bot.get_by_label(f"bot's message: {whole}")).to_be_visible()
            expect(bot.get_by_label("user's message: second")).to_be_visible()
            expect(bot.get_by_label("bot's message: w1", exact=True)).to_be_visible()
            expect(status).to_have_text("Continuing this conversation (4 messages).")
            expect(page.locator("#system textarea")).to_have_value("Be brief.")
            expect(stop).to_be_hidden()
            liked = bot.get_by_label("Liked", exact=True)
            expect(liked).to_have_count(1)  # the first reply's thumbs up, shown after the reload
            liked.click()  # clicked again: nothing more is recorded, and the page shows the recorded rating
            expect(status).to_contain_text("A recorded rating stays")
            expect(liked).to_have_count(1)
            bot.get_by_label("Dislike").last.click()  # the stopped reply, rated after the reload
            expect(status).to_contain_text("Recorded thumbs down on reply 2")
            send(page, "third", whole)
            expect(status).to_have_text("Context: all 2 earlier exchanges sent.")
            expect(stop).to_be_hidden()  # hidden once the browser keeps the turn
            kept = "() => localStorage.getItem('dragon-chat-conversation')"
            bot.get_by_label("Edit").last.click()  # the third reply, edited after the reload
            bot.locator("textarea.edit-textarea").fill("A better third reply.")
            unedited = page.evaluate(kept)
            bot.get_by_label("Submit").click()
            expect(status).to_contain_text("Recorded edit of reply 3")
            page.wait_for_function(f"before => ({kept})() !== before", arg=unedited)  # the browser keeps the edit
            expect(bot.get_by_label("Liked", exact=True)).to_have_count(1)  # the edit leaves the other thumbs shown
            expect(bot.get_by_label("Disliked", exact=True)).to_have_count(1)

            before = page.evaluate(kept)
            page.get_by_role("button", name="Clear", exact=True).click()  # the Chatbot's icon
            expect(bot.get_by_label("user's message: hello")).to_have_count(0)
            page.wait_for_function(f"before => ({kept})() !== before", arg=before)  # the storage has it
            page.reload()
            expect(page.locator("#header")).to_contain_text("Chat with")
            page.wait_for_timeout(1000)  # time for a restore, were there one
            expect(bot.get_by_label("user's message: hello")).to_have_count(0)
            expect(status).not_to_contain_text("Continuing")
            browser.close()
    finally:
        app.close()

    rows = store.records()
    assert [(r["verdict"], r["reply"]) for r in rows] == [("up", whole), ("down", "w1"), ("edit", whole)]
    assert len({r["conversation_id"] for r in rows}) == 1  # one conversation across the reload
    assert rows[1]["turns"][0] == {"role": "system", "content": "Be brief."}
    # every turn a trace (the third, after the reload, too), every rating and edit an assessment on its reply's
    traces = client.search_traces(locations=[experiment])
    assert len(traces) == 3 and all(r["trace_id"] for r in rows) and len({r["trace_id"] for r in rows}) == 3
    for row, name, value in (
        (rows[0], THUMBS, True),
        (rows[1], THUMBS, False),
        (rows[2], EDITED, "A better third reply."),
    ):
        [assessment] = [a for a in client.get_trace(row["trace_id"]).info.assessments if a.name == name]
        assert assessment.value == value, (name, assessment)
    assert backend.seen[-1] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": whole},
        {"role": "user", "content": "second"},
        {"role": "assistant", "content": "w1"},
        {"role": "user", "content": "third"},
    ]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_hostile_reply_stays_text_behind_a_password_in_a_real_browser(chromium, tmp_path):
    """A model that answers with a password form posting elsewhere, a tracking pixel (HTML, Markdown and inside
    a Mermaid diagram) and a script: the page shows it all as text, builds none of it, fetches nothing; every
    response carries the security headers; nothing works before logging in."""
    import requests
    from playwright.sync_api import expect, sync_playwright

    pixel = Pixel()
    reply = (
        f'<form action="http://127.0.0.1:9/x"><input type="password"></form> '
        f'<img src="{pixel.url}/pixel"> <script>document.title = "pwned"</script> '
        f"![logo]({pixel.url}/pixel?markdown)\n\n"
        f'```mermaid\ngraph TD; A["<img src={pixel.url}/pixel?mermaid>"] --> B\n```\n\nThe end.'
    )

    class Hostile(Echo):
        def _chat(self, conversations, **kw):
            self.seen.extend(conversations)
            return [reply for _ in conversations]

    store = SQLiteFeedbackStore(tmp_path / "feedback.db")
    password = "open sesame 42"
    app = chat_ui.build_app(Hostile(), store, "hostile", stream_delay=0)
    url = chat_ui.start(
        app, PageServing(port=free_port(), block=False, quiet=True, password=password, username="tester")
    )
    try:
        # headers on every kind of response: the page, a script asset, an API refusal, the login answer
        page_html = requests.get(url, timeout=10)
        asset = urljoin(url, re.search(r'src="([^"]*assets/[^"]+\.js)"', page_html.text).group(1))
        refused = requests.get(url + "config", timeout=10)
        joined = requests.post(
            url + "gradio_api/queue/join", timeout=10, json={"data": ["hi"], "fn_index": 0, "session_hash": "intruder"}
        )
        wrong = requests.post(url + "login", data={"username": "tester", "password": "guess"}, timeout=10)
        session = requests.Session()
        right = session.post(url + "login", data={"username": "tester", "password": password}, timeout=10)
        for response in (page_html, requests.get(asset, timeout=10), refused, joined, wrong, right):
            assert_security_headers(response)
        assert (refused.status_code, joined.status_code, wrong.status_code, right.status_code) == (401, 401, 400, 200)
        assert session.get(url + "config", timeout=10).status_code == 200

        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(WAIT_MS)
            page.add_init_script(RECORD_VIOLATIONS)
            page.goto(url)
            expect(page.locator("#chatbot")).to_have_count(0)  # the login form, not the chat
            page.get_by_label("username").fill("tester")
            page.get_by_label("password").fill(password)
            page.get_by_role("button", name="Login").click()
            bot = page.locator("#chatbot")
            page.locator("#message textarea").fill("<b>tell</b> me")
            page.locator("#message textarea").press("Enter")
            expect(page.locator("#status")).to_contain_text("Context")  # the reply has finished streaming
            expect(bot.locator(".message-content").last).to_contain_text("The end.")  # and is on the page
            for selector in ("form", "input", "img", "script", "foreignObject", ".mermaid", "b"):
                assert page.query_selector(f"#chatbot .message-content {selector}") is None, selector
            assert page.query_selector("#chatbot form") is None and page.query_selector("#chatbot img") is None
            for text in (
                '<form action="http://127.0.0.1:9/x"><input type="password"></form>',
                f'<img src="{pixel.url}/pixel">',
                '<script>document.title = "pwned"</script>',
                f"![logo]({pixel.url}/pixel?markdown)",
                "<b>tell</b> me",
                # a code block, not a diagram (inside code a reference shows as written: the known cost)
                f'graph TD; A["&#60;img src={pixel.url}/pixel?mermaid>"] --> B',
            ):
                expect(bot).to_contain_text(text)  # shown, as text

            # editing the reply gives back the text exactly as the model wrote it, plus the change
            bot.get_by_label("Edit").last.click()
            edit = bot.locator("textarea.edit-textarea")
            edit.fill(edit.input_value() + " Fixed.")
            bot.get_by_label("Submit").click()
            expect(page.locator("#status")).to_contain_text("Recorded edit of reply 1")
            expect(bot).to_contain_text("Fixed.")
            assert page.query_selector("#chatbot form") is None and page.query_selector("#chatbot img") is None
            page.wait_for_timeout(500)  # time for any fetch the page would make
            assert page.title() != "pwned" and page.evaluate("window.__csp") == []
            browser.close()
    finally:
        app.close()
        pixel.close()

    assert pixel.hits == []  # nothing, not even a blocked attempt that reached the server
    rows = store.records()
    assert [(r["verdict"], r["reply"], r["edited"]) for r in rows] == [("edit", reply, reply + " Fixed.")]
    assert rows[0]["turns"][-1] == {"role": "user", "content": "<b>tell</b> me"}


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_dragon_chat_ui_defaults_in_a_real_browser(chromium, stub, monkeypatch, tmp_path):
    """`dragon chat-ui` with nothing set, over a real OpenAI-compatible server on loopback: the system prompt box
    holds the pipeline's system prompt and the context window box "all"; the name given in the first turn
    reaches the server in the second; a rating is stored with the system prompt first; a typed 0 sends none."""
    from click.testing import CliRunner
    from playwright.sync_api import expect, sync_playwright

    import dragon_dagster
    from dragon_dagster.cli import main
    from dragon_dagster.engine.pipeline import load
    from tests.support import completion

    trained = load(Path(dragon_dagster.__file__).parent / "defs" / "support" / "defs.yaml").system_prompt()
    assert trained

    def respond(n, body):
        said = " ".join(m["content"] for m in body["messages"][:-1])
        if n == 1:
            return 200, completion("Nice to meet you.")
        return 200, completion("Your name is Ada." if "Ada" in said else "I do not know your name.")

    server = stub(respond)
    served = []
    real_launch = chat_ui.launch
    monkeypatch.setattr(
        chat_ui,
        "launch",
        lambda *a, **kw: served.append(
            (a, real_launch(*a, **{**kw, "serving": kw["serving"].model_copy(update={"block": False})}))
        ),
    )
    monkeypatch.setenv("DRAGON_RUNS_DIR", str(tmp_path))
    port = free_port()
    out = CliRunner().invoke(main, ["chat-ui", "--model", server.url, "--port", str(port)], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    (_, store), app = served[0]  # what the CLI hands the page: the pipeline's feedback store, reached
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(WAIT_MS)
            page.goto(f"http://127.0.0.1:{port}/")
            bot, status = page.locator("#chatbot"), page.locator("#status")
            window = page.locator("#context textarea, #context input")
            expect(page.locator("#system textarea")).to_have_value(trained)
            expect(window).to_have_value("all")

            send(page, "My name is Ada.", "Nice to meet you.")
            send(page, "What is my name?", "Your name is Ada.")
            expect(status).to_contain_text("the earlier exchange was sent")
            bot.get_by_label("Like", exact=True).first.click()  # thumbs up on the first reply
            expect(status).to_contain_text("Recorded thumbs up on reply 1")
            window.fill("0")  # explicitly no earlier exchange
            send(page, "And now?", "I do not know your name.")
            expect(status).to_contain_text("dropped the 2 oldest")
            browser.close()
    finally:
        app.close()

    system = {"role": "system", "content": trained}
    sent = [r["body"]["messages"] for r in server.requests]
    assert sent[1] == [
        system,
        {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": "Nice to meet you."},
        {"role": "user", "content": "What is my name?"},
    ]
    assert sent[2] == [system, {"role": "user", "content": "And now?"}]
    assert store.where == str(tmp_path / "feedback" / "support.sqlite")  # no feedback URL set: SQLite, as before
    rows = store.records()
    assert [(r["verdict"], r["reply"]) for r in rows] == [("up", "Nice to meet you.")]
    assert rows[0]["turns"] == [system, {"role": "user", "content": "My name is Ada."}]
