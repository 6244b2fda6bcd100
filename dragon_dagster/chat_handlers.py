"""What the chat page does when a person acts (`ChatHandlers`): send, stream, stop, rate, edit, regenerate, undo,
clear, save and load transcripts, and remember the conversation in the browser; each handler updates the
session's `Chat` (engine/infer/chat.py) and returns what the page's components show (chat_view.py). The page's
layout and serving are chat_ui.py's.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# Before gradio is imported: the page must not phone home (offline machines, privacy of a local model).
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import gradio as gr  # noqa: E402

from .chat_view import ANSWERING, context_note, edited_text, error_line, plural, shown, view, window_turns  # noqa: E402
from .engine.data.feedback.store import FeedbackStore  # noqa: E402
from .engine.data.feedback_turns import FeedbackError  # noqa: E402
from .engine.infer.backend import Backend, BackendError  # noqa: E402
from .engine.infer.chat import Chat  # noqa: E402
from .engine.infer.chat_messages import ChatError, is_answer  # noqa: E402
from .engine.infer.reply_stream import ReplyStream  # noqa: E402
from .engine.infer.tracing import ChatTracer  # noqa: E402
from .engine.tools.declare import Toolset  # noqa: E402

# Errors a user can cause or a backend can raise: shown on the page, never crash the session.
ERRORS = (ChatError, BackendError, FeedbackError, OSError, ValueError)
FORMATS = (".jsonl", ".json")


def _reply_index(chat: Chat, position: int) -> int:
    """Which reply (counting answers only, as Chat.rate/edit do) sits at a Chatbot message index."""
    if not isinstance(position, int) or not 0 <= position < len(chat.messages):
        raise ChatError(f"message {position!r} is not a reply of this conversation")
    if not is_answer(chat.messages[position]):
        raise ChatError(f"message {position!r} is not an answer: only answers are rated, not tool calls or results")
    return sum(1 for m in chat.messages[:position] if is_answer(m))


class ChatHandlers:
    """The page's event handlers, independent of the layout so they can be tested without a browser. Every
    handler takes the session's Chat (None before the first event) plus the settings boxes, and returns the
    Chat back for the gr.State. `stream_delay` is the least time between two page updates of a reply being
    generated (chunks that arrive faster are shown together; 0: every chunk)."""

    def __init__(
        self,
        backend: Backend,
        store: FeedbackStore | None,
        model_label: str = "",
        stream_delay: float = 0.05,
        toolset: Toolset | None = None,
        tracer: ChatTracer | None = None,
    ):
        self.backend, self.store, self.toolset = backend, store, toolset
        self.tracer = tracer  # every session's turns traced to MLflow with it (None: not traced)
        self.model_label = model_label or backend.identity
        self.stream_delay = stream_delay

    # ------------------------------------------------------------------------------------- sessions

    def session(
        self,
        chat: Chat | None,
        system: str | None = None,
        context_turns: Any = None,
        temperature: float = 0.7,
        max_new_tokens: int = 256,
    ) -> Chat:
        """The session's Chat (created on first use) with the current settings boxes applied: the boxes are
        read on every event, so a changed system prompt or window applies from the next turn on."""
        if chat is None:
            chat = Chat(
                self.backend, model_label=self.model_label, store=self.store, toolset=self.toolset, tracer=self.tracer
            )
        turns = window_turns(context_turns)
        chat.system, chat.context_turns = (system or "").strip() or None, turns
        chat.temperature, chat.max_new_tokens = float(temperature), int(max_new_tokens)
        return chat

    def _growing(self, chat: Chat, reply: ReplyStream) -> Iterator[list[dict]]:
        """The Chatbot value while `reply` is generated: the conversation with the reply so far, at most once
        per stream_delay. Backend errors are raised (the history is then unchanged)."""
        last = 0.0
        for _ in reply:
            if time.monotonic() - last >= self.stream_delay:
                last = time.monotonic()
                yield self._with_partial(chat, reply)

    @staticmethod
    def _with_partial(chat: Chat, reply: ReplyStream) -> list[dict]:
        if reply.done:  # committed (or given up): the history says it all
            return view(chat.messages)
        # a regenerated reply is replaced, with the tool turns that led to it
        before = chat.messages[: chat.reply_start()] if reply.regenerate else chat.messages
        return view(before + reply.turns, [{"role": "assistant", "content": shown(reply.text)}])

    @staticmethod
    def _outcome(chat: Chat, reply: ReplyStream, done: str) -> str:
        """The status line once a streamed reply has ended (and why it has no MLflow trace, when it has none)."""
        untraced = f" **Not traced:** {shown(chat.trace_error)}" if chat.trace_error else ""
        if not reply.stopped:
            return done + context_note(chat) + untraced
        if not reply.text:
            return (
                "Stopped before the model wrote anything; the previous reply is kept."
                if reply.regenerate
                else "Stopped before the model wrote anything; your message is back in the box."
            )
        return "**Stopped**: the reply is cut short; rate or edit it like any other. " + context_note(chat) + untraced

    def _streamed(self, chat: Chat, reply: ReplyStream, done: str = "") -> Iterator[tuple]:
        """(chatbot, chat, status) while the reply is generated, then the outcome; errors go to the status."""
        try:
            for value in self._growing(chat, reply):
                yield value, chat, ANSWERING
        except ERRORS as exc:  # the turn failed: history unchanged
            yield view(chat.messages), chat, error_line(exc)
            return
        yield view(chat.messages), chat, self._outcome(chat, reply, done)

    # --------------------------------------------------------------------------------------- turns

    def send(self, text: str, chat: Chat | None, *settings) -> Iterator[tuple]:
        """Outputs (textbox, chatbot, chat, status): the user turn shows at once, then the reply as it is
        generated. A failed turn, or one stopped before any text, puts the message back in the box."""
        try:
            chat = self.session(chat, *settings)
        except ERRORS as exc:
            yield text, gr.skip(), chat, error_line(exc)
            return
        text = (text or "").strip()
        if not text:
            yield "", view(chat.messages), chat, "Type a message first."
            return
        yield "", view(chat.messages + [{"role": "user", "content": text}]), chat, "_waiting for the model…_"
        try:
            reply = chat.stream(text)
        except ERRORS as exc:
            yield text, view(chat.messages), chat, error_line(exc)
            return
        for value, streamed, status in self._streamed(chat, reply):
            yield ("" if reply.text else text), value, streamed, status

    def regenerate(self, chat: Chat | None, *settings) -> Iterator[tuple]:
        """Outputs (chatbot, chat, status): a new answer, streamed, replaces the last reply."""
        try:
            chat = self.session(chat, *settings)
            reply = chat.stream_regenerate()
        except ERRORS as exc:
            yield gr.skip(), chat, error_line(exc)
            return
        yield from self._streamed(chat, reply, "Regenerated. ")

    def stop(self, chat: Chat | None) -> None:
        """No outputs: end the reply being generated. The turn's own handler then shows what was kept (an
        output here would race with its last update)."""
        if chat is not None:
            chat.stop()

    def undo(self, chat: Chat | None) -> tuple:
        """Outputs (textbox, chatbot, chat, status): drop the last exchange; its user text returns to the box
        so it can be changed and sent again."""
        if chat is None or not chat.messages:
            return gr.skip(), gr.skip(), chat, "Nothing to undo."
        try:
            removed = chat.undo()
        except ChatError as exc:  # a reply is being generated
            return gr.skip(), gr.skip(), chat, error_line(exc)
        text = next((m["content"] for m in removed if m["role"] == "user"), "")
        return text, view(chat.messages), chat, f"Removed {plural(len(removed), 'message')}."

    def reset(self, chat: Chat | None) -> tuple:
        """Outputs (textbox, chatbot, chat, status): an empty conversation with a new conversation id."""
        if chat is not None:
            chat.reset()
        return "", [], chat, "New conversation."

    # ------------------------------------------------------------------------------ browser storage

    @staticmethod
    def remember(chat: Chat | None) -> Any:
        """Output (stored): what the browser keeps of the conversation, so a reload continues it (see
        build_app): its id (feedback given after the reload joins the same conversation), the system prompt
        and the messages with each reply's trace id and rating (its stopped mark is not kept). A session
        without a Chat (its kept conversation could not be restored, say) keeps an empty one, so that Clear
        always empties the storage."""
        if chat is None:
            return {"conversation_id": None, "system": None, "messages": []}
        return {
            "conversation_id": chat.conversation_id,
            "system": chat.system,
            "messages": [{k: v for k, v in m.items() if k != "stopped"} for m in chat.messages],
        }

    def restore(self, stored: Any, chat: Chat | None) -> tuple:
        """Outputs (chatbot, chat, system box, status): on a page load, the conversation the browser kept.
        Nothing when this session already has a Chat (the stored value changed because a turn wrote it) or the
        browser kept no messages; a stored value that is not a conversation is said so, and a new one starts."""
        skip = (gr.skip(), gr.skip(), gr.skip())
        if chat is not None or not stored or (isinstance(stored, dict) and not stored.get("messages")):
            return (*skip, gr.skip())
        where = "the conversation kept in this browser"
        try:
            if not isinstance(stored, dict):
                raise ChatError(f"{where}: expected a mapping, got {type(stored).__name__}")
            system, conversation_id = stored.get("system"), stored.get("conversation_id")
            if system is not None and not isinstance(system, str):
                raise ChatError(f"{where}: the system prompt must be text, got {type(system).__name__}")
            if not (isinstance(conversation_id, str) and re.fullmatch(r"[0-9a-f]{32}", conversation_id)):
                conversation_id = None  # a new id: feedback is never filed under an id the browser made up
            restored = Chat.from_messages(
                stored["messages"],
                self.backend,
                where=where,
                system=system,
                model_label=self.model_label,
                store=self.store,
                conversation_id=conversation_id,
                toolset=self.toolset,
                tracer=self.tracer,  # turns after a reload are traced too, and ratings reach their replies' traces
            )
        except ERRORS as exc:
            return (*skip, error_line(f"{exc}; starting a new conversation"))
        n = plural(len(restored.messages), "message")
        return view(restored.messages), restored, restored.system or "", f"Continuing this conversation ({n})."

    # ------------------------------------------------------------------------------------ feedback

    def _saved(self, chat: Chat, what: str, feedback_id: int | None) -> str:
        kept = chat.feedback[-1].get("store_error") if chat.feedback else None
        if kept:  # the store is down: one line naming it, the setting, the host and the fix
            return f"**Kept {what}, not stored yet:** {shown(kept)}"
        where = f"feedback #{feedback_id}" if feedback_id is not None else "no feedback store: not saved"
        problem = chat.feedback[-1].get("assessment_error") if chat.feedback else None
        return f"Recorded {what} ({where}, model `{chat.model_label}`)." + (f" {shown(problem)}" if problem else "")

    def like(self, chat: Chat | None, data: gr.LikeData) -> tuple:
        """Outputs (chatbot, chat, status): a thumbs up or down on a reply goes to the feedback store, once; the
        page then shows every reply's recorded rating (un-clicking a thumb removes no record, so it shows again)."""
        verdict = {True: "up", False: "down", "Like": "up", "Dislike": "down"}.get(data.liked)
        if chat is None:
            return gr.skip(), chat, "Nothing to rate yet."
        if verdict is None:  # un-clicking a thumb: records are append-only
            return (
                view(chat.messages),
                chat,
                "A recorded rating stays (the store keeps every one): click the other thumb to change it.",
            )
        try:
            reply = _reply_index(chat, data.index)
            earlier = chat.rating(reply)
            feedback_id = chat.rate(verdict == "up", index=reply)
        except ERRORS as exc:
            return gr.skip(), chat, error_line(exc)
        if earlier and earlier["verdict"] == verdict:
            where = (
                f"feedback #{feedback_id}"
                if feedback_id is not None
                else "kept until the feedback store answers"
                if chat.kept
                else "not saved: no feedback store"
            )
            status = f"Thumbs {verdict} on reply {reply + 1} is already recorded ({where}): a rating counts once."
            return view(chat.messages), chat, status
        what = f"thumbs {verdict} on reply {reply + 1}" + (
            f", replacing thumbs {earlier['verdict']}" if earlier else ""
        )
        return view(chat.messages), chat, self._saved(chat, what, feedback_id)

    def edit(
        self,
        chat: Chat | None,
        system: str | None,
        context_turns: Any,
        temperature: float,
        max_new_tokens: int,
        data: gr.EditData,
    ) -> Iterator[tuple]:
        """Outputs (chatbot, chat, status). An edited reply is recorded as a better answer and kept, so the
        conversation continues from it; an edited user turn is asked again (later turns are dropped).
        (Settings are named, not *settings: gradio passes the EditData positionally.)"""
        try:
            chat = self.session(chat, system, context_turns, temperature, max_new_tokens)
            text = edited_text(data.value).strip()
            if not text:
                raise ChatError("an edit needs some text")
            if chat.messages[data.index]["role"] != "user" and not is_answer(chat.messages[data.index]):
                raise ChatError("a tool call or its result is what happened: edit the answer after it instead")
            if chat.messages[data.index]["role"] == "assistant":
                reply = _reply_index(chat, data.index)
                feedback_id = chat.edit(text, index=reply)
                yield view(chat.messages), chat, self._saved(chat, f"edit of reply {reply + 1}", feedback_id)
                return
            if chat.active is not None:
                raise ChatError("a reply is still being generated: stop it (or let it finish) first")
            chat.messages = chat.messages[: data.index]  # a changed question: ask it again from there
            reply = chat.stream(text)
        except (*ERRORS, IndexError, TypeError) as exc:
            yield view(chat.messages) if chat else gr.skip(), chat, error_line(exc)
            return
        yield from self._streamed(chat, reply, "Asked again. ")

    # --------------------------------------------------------------------------------- transcripts

    def save(self, chat: Chat | None, fmt: str) -> tuple:
        """Outputs (file, status): the transcript as a download (.jsonl conversations row or .json list)."""
        if chat is None or not chat.messages:
            return gr.update(value=None, visible=False), "Nothing to save yet."
        folder = Path(tempfile.mkdtemp(prefix="dragon-chat-"))  # gradio serves files from the temp dir
        path = chat.save(folder / f"transcript-{chat.conversation_id[:8]}{fmt if fmt in FORMATS else '.jsonl'}")
        n = plural(len(chat.messages), "message")
        return gr.update(value=str(path), visible=True), f"Saved {n} as {path.name}."

    def load(self, path: str | None, chat: Chat | None, *settings) -> tuple:
        """Outputs (chatbot, chat, system box, status): continue a saved transcript; its leading system
        message, when it has one, replaces the system prompt."""
        if not path:
            return gr.skip(), chat, gr.skip(), "No file."
        try:
            current = self.session(chat, *settings)
            loaded = Chat.load(
                path,
                self.backend,
                model_label=self.model_label,
                store=self.store,
                toolset=self.toolset,
                tracer=self.tracer,
            )
            loaded = self.session(loaded, loaded.system or current.system, *settings[1:])
        except ERRORS as exc:
            return gr.skip(), chat, gr.skip(), error_line(f"cannot load {Path(path).name}: {exc}")
        return (
            view(loaded.messages),
            loaded,
            loaded.system or "",
            f"Loaded {plural(len(loaded.messages), 'message')} from {shown(Path(path).name)}.",
        )
