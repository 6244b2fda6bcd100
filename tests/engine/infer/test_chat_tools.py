"""Chat with the pipeline's tools: a reply that calls them runs the calls, the tool turns join the conversation
and the feedback records, and the model answers after the results. A scripted backend writes the calls (fast,
exact); the tiny model taught to call a tool (conftest's tool_caller) does it for real, in the terminal loop."""

from __future__ import annotations

import json

import pytest

from dragon_dagster.engine.data.conversations import conversation_row
from dragon_dagster.engine.data.feedback.sqlite import SQLiteFeedbackStore
from dragon_dagster.engine.data.feedback_rows import preference_pairs, sft_conversations
from dragon_dagster.engine.infer.backend import Backend
from dragon_dagster.engine.infer.chat import Chat
from dragon_dagster.engine.infer.chat_messages import ChatError
from dragon_dagster.engine.infer.chat_tools import HeldCalls
from dragon_dagster.engine.infer.server_backend import ServerBackend
from dragon_dagster.engine.tools.declare import Tools, Toolset
from dragon_dagster.terminal_chat import run_terminal
from tests.support import COUNTING_BUMP

ORDERS = '''
from pathlib import Path

COUNTER = Path({counter!r})


def order_status(order_id: str) -> str:
    """Look up the status of a customer's order.

    Args:
        order_id: The order number, like "A1042".
    """
    with COUNTER.open("a") as f:
        f.write(order_id + "\\n")
    return '{{"order_id": "' + order_id + '", "status": "shipped"}}'
'''
CALL = '<tool_call>\n{"name": "order_status", "arguments": {"order_id": "A1042"}}\n</tool_call>'
RESULT = '{"order_id": "A1042", "status": "shipped"}'


class Caller(Backend):
    """Calls order_status when the last turn is the user's, answers from the result after a tool turn; streams
    in 4-character chunks, so a call block arrives in pieces. `always_call`: it never stops calling."""

    supports_tools = True

    def __init__(self, always_call: bool = False):
        self.seen, self.tools, self.always_call = [], [], always_call

    def _chat(self, conversations, *, max_new_tokens, temperature, top_p, tools=None):
        replies = []
        for conversation in conversations:
            self.seen.append(conversation)
            self.tools.append(tools)
            answered = conversation[-1]["role"] == "tool" and not self.always_call
            replies.append(
                f"It {json.loads(conversation[-1]['content'])['status']}." if answered else "Looking.\n" + CALL
            )
        return replies

    def _stream(self, conversation, *, max_new_tokens, temperature, top_p, stop, tools=None):
        (reply,) = self._chat([conversation], max_new_tokens=max_new_tokens, temperature=0, top_p=1, tools=tools)
        for i in range(0, len(reply), 4):
            yield reply[i : i + 4]


@pytest.fixture()
def orders(tmp_path):
    counter = tmp_path / "calls.txt"
    (tmp_path / "tools.py").write_text(ORDERS.format(counter=str(counter)))
    return Toolset.from_settings(Tools(file=str(tmp_path / "tools.py"), max_calls=2)), counter


def test_held_calls_show_the_words_never_the_block():
    held = HeldCalls()
    shown = [held.add(c) for c in ("Let me", " look.\n<to", "ol_call>\n{", '"name": "x"}', "</tool_call>")]
    assert "".join(shown) == "Let me look.\n" and shown[1] == " look.\n"  # "<to" may start a tag: held back
    assert held.reply.endswith("</tool_call>")
    almost = HeldCalls()
    assert almost.add("a <to") == "a " and almost.add("y> b") == "<toy> b"  # not a tag after all: shown
    unfinished = HeldCalls()
    assert unfinished.add("x <tool_call> {") == "x " and unfinished.rest() == "<tool_call> {"


def test_a_streamed_turn_runs_the_calls_and_keeps_the_tool_turns(orders, tmp_path):
    toolset, counter = orders
    backend = Caller()
    store = SQLiteFeedbackStore(tmp_path / "feedback.sqlite")
    chat = Chat(backend, system="Look orders up.", toolset=toolset, store=store, conversation_id="c1")
    items = list(chat.stream("Where is A1042?"))
    text = [i for i in items if isinstance(i, str)]
    turns = [i for i in items if isinstance(i, dict)]
    assert "".join(text) == "Looking.\nIt shipped." and not any("<" in t for t in text)  # the block never shows
    call = {"type": "function", "function": {"name": "order_status", "arguments": {"order_id": "A1042"}}}
    assert turns == [
        {"role": "assistant", "content": "Looking.", "tool_calls": [call]},
        {"role": "tool", "name": "order_status", "content": RESULT},
    ]
    assert counter.read_text() == "A1042\n"  # the tool ran once
    assert chat.messages == [
        {"role": "user", "content": "Where is A1042?"},
        *turns,
        {"role": "assistant", "content": "It shipped."},
    ]
    # every request rendered the tools; the second one carried the call and its result
    assert [t[0]["function"]["name"] for t in backend.tools] == ["order_status"] * 2
    assert backend.seen[1][-2:] == turns and backend.seen[1][0] == {"role": "system", "content": "Look orders up."}

    # feedback on the answer keeps the tool turns before it, and so do the rows retrained from it
    chat.rate(True)
    chat.edit("A1042 has shipped.")
    records = store.records()
    prompt = [{"role": "system", "content": "Look orders up."}, {"role": "user", "content": "Where is A1042?"}, *turns]
    assert [r["turns"] for r in records] == [prompt, prompt]
    [liked, edited] = sft_conversations(records)
    assert conversation_row(liked["messages"])["prompt"] == prompt
    assert edited["messages"][-1] == {"role": "assistant", "content": "A1042 has shipped."}
    [pair] = preference_pairs(records)
    assert pair["prompt"] == prompt and pair["rejected"] == [{"role": "assistant", "content": "It shipped."}]

    # the next turn sends the earlier calls as context; regenerate asks again from the user turn, calls and all
    chat.say("Thanks")  # (the scripted model looks the order up again)
    assert backend.seen[-1][2:5] == [*turns, {"role": "assistant", "content": "A1042 has shipped."}]
    chat.undo()
    assert chat.regenerate() == "It shipped." and counter.read_text() == "A1042\n" * 3
    assert len(chat.messages) == 4 and chat.messages[1]["tool_calls"]  # the old calls replaced, not added to
    # a transcript keeps the tool turns, and a chat continues from it
    saved = chat.save(tmp_path / "t.jsonl")
    assert Chat.load(saved, Caller(), toolset=toolset).history() == chat.history()


def test_the_calls_of_a_turn_stop_at_max_calls(orders):
    toolset, counter = orders
    chat = Chat(Caller(always_call=True), toolset=toolset)
    answer = chat.say("Where is A1042?")
    assert counter.read_text().splitlines() == ["A1042", "A1042"]  # max_calls: 2
    assert answer == "Looking.\n" + CALL  # the reply past the limit is the answer, as written
    assert [m["role"] for m in chat.messages] == ["user"] + ["assistant", "tool"] * 2 + ["assistant"]
    with pytest.raises(ChatError, match="no reply 1"):
        chat.rate(True, index=1)  # only the answer is a reply to rate; the call turns are not


def test_the_terminal_prints_each_call_and_its_result(orders, tmp_path):
    toolset, counter = orders
    out = []
    chat = Chat(Caller(), toolset=toolset, store=SQLiteFeedbackStore(tmp_path / "f.sqlite"))
    lines = iter(["Where is A1042?", "/up", "/history", "/quit"])
    run_terminal(chat, input_fn=lambda _: next(lines), print_fn=lambda *a: out.append(" ".join(map(str, a))))
    call_line = '-> order_status({"order_id": "A1042"})'
    assert out[1:5] == ["Looking.", call_line, f"   = {RESULT}", "It shipped."]
    assert out[5].startswith("recorded up (feedback #1)")
    assert f"[tool] {RESULT}" in out and call_line in out[6:]  # /history shows them too
    assert chat.store.records()[0]["turns"][-1]["role"] == "tool"


def test_tools_run_only_with_a_local_model(orders):
    toolset, _ = orders
    with pytest.raises(ChatError, match="run only with a local model"):
        Chat(ServerBackend("http://127.0.0.1:9/v1", "m"), toolset=toolset)


def test_dragon_chat_with_a_server_says_the_tools_are_not_run(monkeypatch, tmp_path):
    """The bundled orders pipeline declares order_status: a chat with a server model goes on without it, saying
    so; `dragon chat-ui` alike."""
    from click.testing import CliRunner

    from dragon_dagster import chat_ui, cli
    from dragon_dagster import terminal_chat as chat_module

    monkeypatch.setenv("DRAGON_RUNS_DIR", str(tmp_path / "runs"))
    chats, pages = [], []
    monkeypatch.setattr(chat_module, "run_terminal", lambda chat: chats.append(chat))
    monkeypatch.setattr(chat_ui, "launch", lambda *a, **kw: pages.append(kw))
    for command, seen in (("chat", lambda: chats[-1].toolset), ("chat-ui", lambda: pages[-1]["toolset"])):
        out = CliRunner().invoke(cli.main, [command, "--pipeline", "orders", "--model", "http://127.0.0.1:9/v1"])
        assert out.exit_code == 0, out.output
        said = " ".join(out.output.split())
        assert "the pipeline's tools (order_status) run only with a local model" in said and seen() is None


def test_dragon_chat_runs_the_tool_a_taught_model_calls(tool_caller, monkeypatch, tmp_path):
    """`dragon chat` with the tiny model taught to call bump, its pipeline declaring bump: the call runs (the
    counter file counts it) and prints with its result, and /up records the answer with the tool turns before
    it, which the retraining rows keep."""
    from types import SimpleNamespace

    from click.testing import CliRunner

    from dragon_dagster import chat_target, cli
    from dragon_dagster.resources.storage import ArtifactStore

    counter = tmp_path / "counter.txt"
    (tmp_path / "tools.py").write_text(COUNTING_BUMP.format(counter=str(counter)))
    declared = SimpleNamespace(tools=Tools(file=str(tmp_path / "tools.py"), timeout=5, max_calls=2))
    monkeypatch.setattr(chat_target, "find_pipeline", lambda name: declared)  # the pipeline `counting` declares bump
    monkeypatch.setenv("DRAGON_RUNS_DIR", str(tmp_path / "runs"))
    args = ["chat", "--pipeline", "counting", "--model", str(tool_caller), "--system", ""]
    out = CliRunner().invoke(cli.main, args, input="Check the counter\n/up\n/quit\n")
    assert out.exit_code == 0, out.output
    assert "tools: bump (at most 2 call(s) a turn, 5 s each)" in " ".join(out.output.split())
    assert counter.read_text() == "x\n"  # the tool ran, once
    # the call and its result on lines of their own, then the answer streamed after them
    assert "-> bump({})\n   = count 1\nDone.\n" in out.stdout, out.stdout
    assert "recorded up (feedback #1)" in out.stdout
    [record] = SQLiteFeedbackStore(ArtifactStore().feedback_path("counting")).records()
    call = {"type": "function", "function": {"name": "bump", "arguments": {}}}
    assert record["reply"] == "Done." and record["verdict"] == "up"
    assert record["turns"] == [
        {"role": "user", "content": "Check the counter"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": "bump", "content": "count 1"},
    ]
    [row] = sft_conversations([record])
    assert conversation_row(row["messages"]) == {
        "prompt": record["turns"],
        "completion": [{"role": "assistant", "content": "Done."}],
    }
