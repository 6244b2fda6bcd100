"""A chat session with any Backend (dragonfarm's dragon_chat / dragon_chat_load), with feedback.

`Chat` keeps the message history and sends it on every turn, so the model has context; `context_turns=N`
sends only the last N earlier exchanges (user turn + reply) with the new message, and `last_dropped` says how
many were left out. Ratings (`rate`) and edits (`edit`) go to a `FeedbackStore` as training data
(`feedback.sft_conversations` / `feedback.preference_pairs`); an edit also replaces the reply in the history,
so the conversation continues from the better one. A message (a user turn, the system prompt, an edit) longer
than `max_message_chars` (default `feedback.MAX_MESSAGE_CHARS`) is refused with its length and the limit, before
it reaches the model or the store. `stream(text)` and `stream_regenerate()` give the reply as a `ReplyStream` of
text chunks while it is generated; `stop()` (or `ReplyStream.stop()`, from any thread) ends it early, and the
text so far becomes the reply, marked stopped (`is_stopped`), to be rated or edited like any other. Transcripts
use the training data's message format:
`save("x.json")` writes a list of role/content messages, `save("x.jsonl")` one conversations row
{"messages": [...]}; `Chat.load` reads both. The front ends are outside the engine: the terminal's
(terminal_chat.py) and the web page's (chat_ui.py).

Tools: a Chat given the pipeline's `toolset` (on a backend that supports_tools: a local model) renders its tools
in every request, and a reply that calls them does not end the turn: the calls run (each through the Toolset:
a timeout, errors as answers; at most its max_calls in one turn), the assistant turn with its tool_calls and a
tool turn per result join the history, and the model replies again, until a reply calls nothing: that is the
answer, the one rated or edited. The tool turns go with the turns of every feedback record after them, so
retraining shows the model the calls and results it answered after. A streamed turn yields each tool turn
(a dict) as it is made, between the text chunks; `regenerate` asks again from the user turn, calls included.

Tracing: a Chat given a `tracer` (engine/infer/tracing.ChatTracer) makes every answered turn (said, streamed,
regenerated, stopped) an MLflow trace, and keeps its id on the reply (`trace_id`, as `stopped` is kept: not part
of the conversation); a rating or an edit of that reply is written to the store with the trace id, then as an
assessment on the trace (see `_record` for why in that order). Without a tracer nothing of MLflow is imported.
Framework-free: nothing here imports Dagster.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

from ..data.conversations import conversation_row
from ..data.errors import DataError
from ..data.feedback.records import MAX_MESSAGE_CHARS, too_long
from ..data.feedback.store import FeedbackStore
from ..outages import StoreUnavailable
from ..tools.declare import Toolset
from .backend import Backend
from .backend_registry import as_backend
from .chat_messages import ChatError, exchanges, is_answer, kept_marks, parse_messages, plain
from .reply_stream import ReplyStream
from .tracing import ChatTracer, TracingError


class Chat:
    """A multi-turn conversation with `backend` (a Backend, a config mapping or a model spec); with `toolset`
    (the pipeline's tools), its replies may call them (see the module's docstring)."""

    def __init__(
        self,
        backend: Backend | dict | str,
        system: str | None = None,
        context_turns: int | None = None,
        model_label: str = "",
        store: FeedbackStore | None = None,
        conversation_id: str | None = None,
        max_new_tokens: int = 256,
        temperature: float = 0.7,
        top_p: float = 0.9,
        max_message_chars: int | None = MAX_MESSAGE_CHARS,
        toolset: Toolset | None = None,
        tracer: ChatTracer | None = None,
    ):
        if context_turns is not None and (not isinstance(context_turns, int) or context_turns < 0):
            raise ChatError(f"context_turns must be an integer >= 0 or None, got {context_turns!r}")
        self.backend = as_backend(backend)
        if toolset is not None and not self.backend.supports_tools:
            raise ChatError(
                f"{self.backend.identity} does not run tools: the pipeline's tools run only with a local model"
            )
        self.toolset = toolset
        self.tracer = tracer  # None: no tracing
        self.system = system or None
        self.context_turns = context_turns
        self.model_label = str(model_label or self.backend.identity)
        self.store = store
        self.conversation_id = conversation_id or uuid.uuid4().hex
        self.max_new_tokens, self.temperature, self.top_p = max_new_tokens, temperature, top_p
        self.max_message_chars = max_message_chars
        self.messages: list[dict] = []  # user, assistant and tool turns; the system prompt is kept apart
        self.last_dropped = 0  # earlier exchanges left out of the last request (context_turns)
        self.last_sent: list[dict] = []  # the conversation the backend last received (without the system)
        self.feedback: list[dict] = []  # the feedback events of this session, with their store id (or None)
        # events the store did not take because it was down (StoreUnavailable), in order: stored with the next
        # rating or edit (store_kept), so an outage loses no rating of a session that goes on
        self.kept: list[dict] = []
        self.trace_error: str | None = None  # why the last answered turn has no MLflow trace (None: it has one)
        self.active: ReplyStream | None = None  # the reply being streamed, if any

    def __repr__(self) -> str:
        return f"<Chat {self.conversation_id} with {self.model_label}: {len(self.messages)} message(s)>"

    # ------------------------------------------------------------------------------------- talking

    def _context(self, messages: list[dict]) -> tuple[list[dict], int]:
        """What the backend gets for `messages` (the context window applied) and how many exchanges it drops."""
        earlier = exchanges(messages[:-1])
        keep = len(earlier) if self.context_turns is None else min(self.context_turns, len(earlier))
        sent = [plain(m) for group in earlier[len(earlier) - keep :] for m in group] + [plain(messages[-1])]
        return sent, len(earlier) - keep

    def _tools(self) -> dict:
        """The backend's tools keyword: the toolset's schemas, rendered in every request (none without tools)."""
        return {"tools": self.toolset.schemas} if self.toolset is not None else {}

    def reply_start(self) -> int:
        """Where the last reply begins in the history: the answer itself, or the first of the tool turns that
        led to it (regenerating asks again from there)."""
        start = len(self.messages) - 1
        while start > 0 and (self.messages[start - 1]["role"] == "tool" or self.messages[start - 1].get("tool_calls")):
            start -= 1
        return start

    def _streamed(self, reply: ReplyStream) -> str:
        """A turn with tools, not streamed: the stream run to its end (its calls run), the answer's text."""
        for _ in reply:
            pass
        return reply.text

    def _trace(self, sent: list[dict], reply: str, started_ns: int, stopped: bool = False) -> str | None:
        """The trace id of an answered turn (sent: what the model got, without the system prompt), or None
        without a tracer or when tracing failed (the tracer's last_error says why; the chat goes on)."""
        if self.tracer is None:
            return None
        ended = time.time_ns()
        conversation = [{"role": "system", "content": self.system}] if self.system else []
        conversation += [plain(m) for m in sent]
        trace_id = self.tracer.turn(
            conversation_id=self.conversation_id,
            messages=conversation,
            reply=reply,
            model=self.model_label,
            started_ns=started_ns,
            ended_ns=ended,
            usage=self.backend.usage(conversation, reply, self.toolset.schemas if self.toolset else None),
            stopped=stopped,
        )
        self.trace_error = None if trace_id else self.tracer.last_error
        return trace_id

    def _answer(self, sent: list[dict], reply: str, started_ns: int) -> dict:
        """The reply message of a turn, with its trace id when it was traced."""
        trace_id = self._trace(sent, reply, started_ns)
        return {"role": "assistant", "content": reply, **({"trace_id": trace_id} if trace_id else {})}

    def _ask(self, messages: list[dict]) -> str:
        sent, dropped = self._context(messages)
        (reply,) = self.backend.chat(
            [sent],
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            system=self.system,
        )
        self.last_dropped, self.last_sent = dropped, sent
        return reply

    def _check_length(self, text: str, what: str) -> None:
        problem = too_long(text, self.max_message_chars, what)
        if problem:
            raise ChatError(problem)

    def _check_turn(self, text: Any, what: str) -> None:
        if not isinstance(text, str) or not text.strip():
            raise ChatError(f"{what}() needs a non-empty message")
        self._check_length(text, "the message")
        if self.system:
            self._check_length(self.system, "the system prompt")

    def _check_idle(self) -> None:
        if self.active is not None:
            raise ChatError("a reply is still being generated: stop it (or let it finish) first")

    def say(self, text: str) -> str:
        """Send a user turn with the conversation so far and return the reply (kept in the history)."""
        self._check_turn(text, "say")
        self._check_idle()
        if self.toolset is not None:
            return self._streamed(self.stream(text))
        self.messages.append({"role": "user", "content": text})
        started = time.time_ns()
        try:
            reply = self._ask(self.messages)
        except BaseException:
            self.messages.pop()  # a failed turn leaves the history as it was
            raise
        self.messages.append(self._answer(self.last_sent, reply, started))
        return reply

    def regenerate(self) -> str:
        """Ask again for the last reply and replace it with the new one."""
        self._check_regenerate()
        if self.toolset is not None:
            return self._streamed(self.stream_regenerate())
        started = time.time_ns()
        reply = self._ask(self.messages[:-1])
        self.messages[-1] = self._answer(self.last_sent, reply, started)
        return reply

    def _check_regenerate(self) -> None:
        self._check_idle()
        if not self.messages or not is_answer(self.messages[-1]):
            raise ChatError("there is no reply to regenerate")

    # ------------------------------------------------------------------------------------ streaming

    def stream(self, text: str) -> ReplyStream:
        """Send a user turn and get the reply as it is generated: iterate the ReplyStream for text chunks.
        The user turn joins the history when iteration starts, the reply when it ends (see ReplyStream)."""
        self._check_turn(text, "stream")
        self._check_idle()
        return ReplyStream(self, regenerate=False, user_text=text)

    def stream_regenerate(self) -> ReplyStream:
        """regenerate(), streamed: the new reply replaces the last one when it ends with some text (a stop
        before any text keeps the old reply)."""
        self._check_regenerate()
        return ReplyStream(self, regenerate=True)

    def stop(self) -> bool:
        """Stop the reply being streamed, if any (from any thread); whether there was one."""
        active = self.active
        if active is not None:
            active.stop()
        return active is not None

    def is_stopped(self, index: int = -1) -> bool:
        """Whether a reply (index over the replies; -1 is the last) was stopped before it finished."""
        return bool(self.messages[self._reply_position(index)].get("stopped"))

    def _begin(self, reply: ReplyStream) -> None:
        # checked again at the start: the history may have changed since the stream was made
        if reply.regenerate:
            self._check_regenerate()
        self._check_idle()
        if not reply.regenerate:
            self._check_turn(reply.user_text, "stream")  # the system prompt may have changed since
            self.messages.append({"role": "user", "content": reply.user_text})
        self.active = reply

    def _abort(self, reply: ReplyStream) -> None:
        """A streamed turn that failed or was stopped before any text: the history as it was."""
        if self.active is not reply:
            return
        if not reply.regenerate and self.messages and self.messages[-1]["role"] == "user":
            self.messages.pop()
        self.active = None

    def _commit(self, reply: ReplyStream, messages: list[dict], sent: list[dict], dropped: int) -> None:
        """The turn's messages (tool turns, then the answer) join the history; regenerated, they replace the
        last reply and the tool turns that led to it."""
        if self.active is not reply:  # the history was reset under it: nothing to attach the reply to
            return
        if reply.regenerate:
            self.messages[self.reply_start() :] = messages
        else:
            self.messages += messages
        self.last_dropped, self.last_sent, self.active = dropped, sent, None

    def undo(self) -> list[dict]:
        """Drop the last exchange (the last user turn and what followed it); returns the removed messages."""
        self._check_idle()
        if not self.messages:
            raise ChatError("there is nothing to undo")
        starts = [i for i, m in enumerate(self.messages) if m["role"] == "user"]
        cut = starts[-1] if starts else 0
        removed, self.messages = self.messages[cut:], self.messages[:cut]
        return [plain(m) for m in removed]

    def reset(self) -> None:
        """Clear the history and start a new conversation (new conversation_id); a reply being streamed is
        stopped and dropped."""
        self.stop()
        self.messages, self.last_sent, self.last_dropped, self.active = [], [], 0, None
        self.conversation_id = uuid.uuid4().hex

    def history(self) -> list[dict]:
        """The conversation as role/content messages, the system prompt first when there is one."""
        system = [{"role": "system", "content": self.system}] if self.system else []
        return system + [plain(m) for m in self.messages]

    def context_usage(self) -> dict:
        """Exchanges in the history, how many the last request sent and dropped, and the context_turns limit."""
        return {
            "exchanges": len(exchanges(self.messages)),
            "sent": len(exchanges(self.last_sent)),
            "dropped": self.last_dropped,
            "context_turns": self.context_turns,
        }

    # ------------------------------------------------------------------------------------ feedback

    def _reply_position(self, index: int) -> int:
        replies = [i for i, m in enumerate(self.messages) if is_answer(m)]
        if not replies:
            raise ChatError("there is no reply yet")
        try:
            return replies[index]
        except (IndexError, TypeError):
            raise ChatError(f"no reply {index!r}: the conversation has {len(replies)} reply(ies)") from None

    def _record(self, position: int, verdict: str, edited: str | None = None) -> int | None:
        """Store the event, then (traced) its assessment. The store is what retraining reads, so it is written
        first, with the trace id: a failed store write leaves MLflow untouched (nothing to disagree with), and a
        failed assessment leaves a store record that names its trace, kept pending on the tracer (retried with
        the next rating) and said in the event's `assessment_error`, never silently dropped. The other order
        could leave an assessment that no store record has, which retraining from the store would not see.

        A store that is down (StoreUnavailable, once its own retries are spent) loses nothing either: the event
        is kept (`kept`, its id None, the store's one line in its `store_error`) and stored before the next
        rating or edit, in order, under the key it was first tried with, so a write whose acknowledgement was
        lost is found rather than stored twice."""
        system = [{"role": "system", "content": self.system}] if self.system else []
        turns = system + [plain(m) for m in self.messages[:position]]
        event = {
            "conversation_id": self.conversation_id,
            "turns": turns,
            "reply": self.messages[position]["content"],
            "verdict": verdict,
            "edited": edited,
            "model": self.model_label,
            "trace_id": self.messages[position].get("trace_id"),
            "id": None,
            "key": uuid.uuid4().hex,
            "assessment_error": None,
            "store_error": None,
        }
        if not any(m["role"] == "user" for m in event["turns"]):
            raise ChatError("that reply has no user turn before it; there is nothing to learn from it")
        if self.store is None:
            self.feedback.append(event)
            return None
        if self.store_kept():  # the store still refuses: this one waits behind the kept ones, in order
            event["store_error"] = self.kept[0]["store_error"]
            self.kept.append(event)
        elif not self._store(event):
            self.kept.append(event)
        self.feedback.append(event)
        return event["id"]

    def _store(self, event: dict) -> bool:
        """Write one event to the store, then its assessment; False, with the store's one line in
        `store_error`, when the store is down. Bad input (FeedbackError) is raised, as before."""
        try:
            event["id"] = self.store.record(
                event["conversation_id"],
                event["turns"],
                event["reply"],
                event["verdict"],
                event["edited"],
                event["model"],
                trace_id=event["trace_id"],
                key=event["key"],
            )
        except StoreUnavailable as exc:
            event["store_error"] = (
                f"{exc} The {'edit' if event['verdict'] == 'edit' else 'rating'} is kept in this chat and stored "
                "with its next rating or edit."
            )
            return False
        event["store_error"] = None
        if self.tracer is not None and event["trace_id"]:
            try:
                self.tracer.assess(event["trace_id"], event["verdict"], event["edited"], event["id"])
            except TracingError as exc:
                event["assessment_error"] = str(exc)
        return True

    def store_kept(self) -> int:
        """Store the events kept while the store was down, in order, stopping at the first it still refuses;
        how many are still kept."""
        while self.kept and self._store(self.kept[0]):
            self.kept.pop(0)
        return len(self.kept)

    def rating(self, index: int = -1) -> dict | None:
        """The reply's current rating ({"verdict", "feedback_id"}), None when it has none."""
        return self.messages[self._reply_position(index)].get("rating")

    def rate(self, up: bool | str, index: int = -1) -> int | None:
        """Record a verdict on a reply (index over the replies; -1 is the last). Returns the feedback id, or
        None when the chat has no store (the event is still kept in `feedback`). A rating counts once: the same
        verdict again records nothing and returns the first one's id; a changed verdict is a new record, which
        the feedback datasets take over the earlier one (data/feedback_rows.py), both kept in the store."""
        if isinstance(up, str):
            if up not in ("up", "down"):
                raise ChatError(f"rate() takes True/False or 'up'/'down', got {up!r}")
            up = up == "up"
        verdict, position = "up" if up else "down", self._reply_position(index)
        earlier = self.messages[position].get("rating")
        if earlier and earlier["verdict"] == verdict:
            return earlier["feedback_id"]
        feedback_id = self._record(position, verdict)
        self.messages[position] = {
            **self.messages[position],
            "rating": {"verdict": verdict, "feedback_id": feedback_id},
        }
        return feedback_id

    def edit(self, text: str, index: int = -1) -> int | None:
        """Replace a reply with better text: recorded as an 'edit' (with the original reply) and kept in the
        history, so the conversation continues from the better reply. Returns the feedback id (or None)."""
        if not isinstance(text, str) or not text.strip():
            raise ChatError("edit() needs the improved reply text")
        self._check_length(text, "the edited reply")
        position = self._reply_position(index)
        feedback_id = self._record(position, "edit", edited=text)
        trace_id = self.messages[position].get("trace_id")  # the better reply still answers that traced turn
        self.messages[position] = {"role": "assistant", "content": text, **({"trace_id": trace_id} if trace_id else {})}
        return feedback_id

    # ---------------------------------------------------------------------------------- transcripts

    def as_example(self) -> dict:
        """The conversation as one prompt-completion training row (it must end with a reply)."""
        try:
            return conversation_row(self.history())
        except DataError as exc:
            raise ChatError(str(exc)) from exc

    def save(self, path: str | Path) -> Path:
        """Write the transcript: .jsonl as one {"messages": [...]} row (a conversations dataset), anything
        else as a JSON list of messages. Returns the path."""
        path = Path(path).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".jsonl":
            text = json.dumps({"messages": self.history()}, ensure_ascii=False) + "\n"
        else:
            text = json.dumps(self.history(), ensure_ascii=False, indent=2) + "\n"
        path.write_text(text, encoding="utf-8")
        return path

    @staticmethod
    def read_transcript(path: str | Path) -> list[dict]:
        """The messages of a transcript: a JSON list of messages or {"messages": [...]}, or JSONL with one
        message per line or one {"messages": [...]} row."""
        path = Path(path).expanduser()
        text = path.read_text(encoding="utf-8")
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            try:
                value = [json.loads(line) for line in text.splitlines() if line.strip()]
            except json.JSONDecodeError as exc:
                raise ChatError(f"{path} is neither JSON nor JSONL: {exc}") from None
            if value and all(isinstance(v, dict) and "messages" in v for v in value):
                if len(value) != 1:
                    raise ChatError(f"{path} holds {len(value)} conversations; a transcript is one") from None
                value = value[0]
        if isinstance(value, dict) and "messages" in value:
            value = value["messages"]
        return parse_messages(value, where=str(path))

    @classmethod
    def load(cls, path: str | Path, backend: Backend | dict | str, **kwargs) -> Chat:
        """A Chat that continues a saved transcript; a leading system message becomes the system prompt
        unless `system` is given."""
        return cls.from_messages(cls.read_transcript(path), backend, where=str(path), **kwargs)

    @classmethod
    def from_messages(cls, items: Any, backend: Backend | dict | str, where: str = "transcript", **kwargs) -> Chat:
        """A Chat that continues `items` (role/content messages, checked: errors name `where`); a leading
        system message becomes the system prompt unless `system` is given."""
        messages = parse_messages(items, where=where)
        # one clean message per item (clean_messages checks, never merges): each answer keeps its marks
        messages = [{**m, **kept_marks(item)} if is_answer(m) else m for m, item in zip(messages, items, strict=True)]
        if messages and messages[0]["role"] == "system":
            kwargs.setdefault("system", messages[0]["content"])
            messages = messages[1:]
        if any(m["role"] == "system" for m in messages):
            raise ChatError(f"{where}: a system message may only come first")
        chat = cls(backend, **kwargs)
        chat.messages = messages
        return chat


# ------------------------------------------------------------------------------------------- terminal
