"""A web chat page (Gradio) over any inference Backend, with every rating and edit kept as training data.

The page is a thin skin over `engine.chat.Chat`: one Chat per browser session (a `gr.State`), so context
handling, feedback records and transcripts behave exactly as in `dragon chat` on the terminal. Features:
multi-turn context, by default the whole conversation (the context window box shows "all"; a number N sends
only the last N earlier exchanges, 0 none, and the status line says how many of the oldest were dropped), a
system prompt box (`dragon chat-ui` fills it with the pipeline's system prompt, `Pipeline.system_prompt()`: the
one every training row carries, so ratings and edits are stored with the prompt the model trains with), replies
streamed onto the page as the model generates them (`Chat.stream`)
with a Stop button, shown while a reply is generated, that ends it early and keeps what it has so far, thumbs
up / down and in-place editing of a reply (both recorded in the `FeedbackStore` with the model that answered),
one Regenerate, Undo and Clear each, save / load of transcripts in the training data's message format (.jsonl:
one {"messages": [...]} row; .json: a list of messages), and the conversation kept in the browser's local storage
so a reload continues it (`ChatHandlers.remember` / `restore`). The header names the model as people know it
(`model_name`, e.g. `models:/support@champion (version 3)`); feedback records `model_label`, its directory.
With the pipeline's tools (`toolset`, a local model only), a reply that calls them runs the calls (`Chat`), and
each call and each result shows as a block of its own (a titled Chatbot message: `-> name({...})`, then the
tool's answer) before the answer; only answers take thumbs and edits, and the feedback keeps the blocks' turns.

The page shows what a model wrote as text and Markdown, never as HTML (chat_view.py: how a conversation shows on
the page, every message made inert by `shown()`), every response carries a Content-Security-Policy with no outside
sources and X-Frame-Options / X-Content-Type-Options (`web.SecurityHeaders`, shared with the studio), and
`start(..., password=...)` puts the page behind Gradio's login. Ratings and edits become training data that is
promoted automatically, so a page reachable beyond this machine must have a password (`start` warns when it has
none).

`build_app(backend, store, model_label)` returns the `gr.Blocks`; `start(app, serving)` serves it as a PageServing
says (page_serving.py: host, port, login, shared with the studio); `launch(model, store_path, serving, ...)` does both
from a model spec, a backend config or a Backend (what `dragon chat-ui` calls).
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

from .chat_target import ChatTarget  # noqa: E402
from .chat_view import (  # noqa: E402
    ALL,
    ANSWERING,
    context_note,
    edited_text,
    error_line,
    plural,
    shown,
    view,
    window_turns,
    window_value,
)
from .engine.data.feedback.sqlite import SQLiteFeedbackStore  # noqa: E402
from .engine.data.feedback.store import FeedbackStore  # noqa: E402
from .engine.data.feedback_turns import FeedbackError  # noqa: E402
from .engine.infer.backend import Backend, BackendError  # noqa: E402
from .engine.infer.backend_registry import as_backend  # noqa: E402
from .engine.infer.chat import Chat  # noqa: E402
from .engine.infer.chat_messages import ChatError, is_answer  # noqa: E402
from .engine.infer.reply_stream import ReplyStream  # noqa: E402
from .engine.infer.tracing import ChatTracer  # noqa: E402
from .engine.tools.declare import Toolset  # noqa: E402
from .page_serving import PageServing, exposed  # noqa: E402
from .web import serve  # noqa: E402

# Errors a user can cause or a backend can raise: shown on the page, never crash the session.
ERRORS = (ChatError, BackendError, FeedbackError, OSError, ValueError)
FORMATS = (".jsonl", ".json")
CSS = " ".join(
    [
        "#status {min-height: 2.5em} footer {display: none !important}",
        # room under the Chatbot's Clear icon (top right), which otherwise sits on the first message
        "#chatbot .bubble-wrap {padding-top: 2.5em}",
        # an edit box as wide as the conversation, not as the reply it edits
        "#chatbot .message-row:has(textarea.edit-textarea), #chatbot .message-row:has(textarea.edit-textarea) "
        ".message {width: 100%; max-width: 100%; box-sizing: border-box}",
        "#chatbot textarea.edit-textarea {width: 100% !important; min-height: 6em}",
        # a pencil only on replies: they are what an edit teaches (the header says so); a question is asked again
        # by sending it
        "#chatbot .message-buttons-right button[aria-label='Edit'] {display: none !important}",
    ]
)


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


def build_app(
    backend: Backend | dict | str,
    store: FeedbackStore | str | Path | None,
    model_label: str = "",
    model_name: str = "",
    system: str | None = None,
    context_turns: int | None = None,
    temperature: float = 0.7,
    max_new_tokens: int = 256,
    stream_delay: float = 0.05,
    toolset: Toolset | None = None,
    tracer: ChatTracer | None = None,
) -> gr.Blocks:
    """The chat page for `backend`, recording feedback into `store` (a feedback store, a SQLite file's path, or None).
    `model_label` is recorded with each rating and edit (default: the backend's identity); `model_name` is what
    the header calls the model (default: the label), e.g. `models:/support@champion (version 3)`. `toolset`: the
    pipeline's tools, run when a reply calls them (a local model only). `tracer`: every turn an MLflow trace,
    every rating and edit an assessment on it (engine/infer/tracing.py)."""
    backend = as_backend(backend)
    if isinstance(store, str | Path):
        store = SQLiteFeedbackStore(store)
    h = ChatHandlers(backend, store, model_label, stream_delay=stream_delay, toolset=toolset, tracer=tracer)
    name = model_name or h.model_label
    where = f"`{shown(store.where)}`" if store is not None else "nowhere (no feedback store)"
    tools = (
        f"\nTools: {shown(', '.join(toolset.names))}; each call and its result show as blocks before the answer."
        if toolset is not None
        else ""
    )
    with gr.Blocks(title=f"dragon chat: {name}", analytics_enabled=False) as app:
        gr.Markdown(
            f"### Chat with `{shown(name)}`\nRate a reply with the thumbs under it, or edit it "
            f"(pencil) into a better answer: both are recorded as training data in {where}.{tools}",
            elem_id="header",
        )
        chat = gr.State(None)  # one Chat per browser session
        # The conversation survives a reload because the browser keeps it: Gradio's BrowserState, in the
        # page's local storage (per origin: every dragon chat page served from this host and port continues it,
        # across server restarts too). No server-side session store to expire or clean up, and a conversation
        # is no one else's to see. Gradio encrypts the value with `secret`, which the page itself carries: it
        # hides nothing from whoever can run scripts on the page, so a fixed one keeps values readable after a
        # restart. The server checks what comes back like a loaded transcript (ChatHandlers.restore). Clear
        # empties it.
        stored = gr.BrowserState(None, storage_key="dragon-chat-conversation", secret="dragon-chat")
        with gr.Row():
            with gr.Column(scale=3):
                chatbot = gr.Chatbot(
                    label="Conversation",
                    height=460,
                    editable="all",
                    elem_id="chatbot",
                    buttons=["copy"],
                    placeholder="Say something to start.",
                )
                with gr.Row():
                    box = gr.Textbox(
                        placeholder="Message (Enter sends)",
                        show_label=False,
                        scale=5,
                        elem_id="message",
                        autofocus=True,
                    )
                    send = gr.Button("Send", variant="primary", scale=1, elem_id="send")
                    # shown only while a reply is being generated (see `streaming` below)
                    stop = gr.Button("Stop", variant="stop", scale=1, elem_id="stop", visible=False)
                # One of each control: the Chatbot's own retry and undo icons appear only when their events
                # have listeners, and they have none (these buttons do the same, and say what they do); its
                # Clear icon (top right) is always there, so it is the page's only Clear.
                with gr.Row():
                    regen = gr.Button("↻ Regenerate", size="sm", elem_id="regenerate")
                    undo = gr.Button("↶ Undo", size="sm", elem_id="undo")
                status = gr.Markdown("", elem_id="status")
            with gr.Column(scale=2):
                system_box = gr.Textbox(value=system or "", label="System prompt", lines=4, elem_id="system")
                # A Textbox, not a gr.Number: a Number cannot be empty (None shows and sends 0, which would
                # send no earlier exchange at all), and "all" must be a value the box can show.
                window = gr.Textbox(
                    value=window_value(context_turns),
                    elem_id="context",
                    max_lines=1,
                    label=f"Context window: earlier exchanges sent with each message ({ALL}, or a "
                    f"number: the last N; 0: none)",
                )
                with gr.Accordion("Generation", open=False):
                    temp = gr.Slider(0.0, 2.0, value=temperature, step=0.05, label="Temperature")
                    tokens = gr.Slider(16, 4096, value=max_new_tokens, step=16, label="Max new tokens")
                fmt = gr.Radio(list(FORMATS), value=".jsonl", label="Transcript format")
                with gr.Row():
                    save = gr.Button("Save transcript", size="sm", elem_id="save")
                    upload = gr.UploadButton(
                        "Load transcript", size="sm", file_types=list(FORMATS), type="filepath", elem_id="load"
                    )
                saved = gr.File(label="Transcript", visible=False, interactive=False, elem_id="transcript")
        settings = [system_box, window, temp, tokens]
        turn_out = [chatbot, chat, status]

        # The small steps around a turn never wait for another session's turn (no concurrency limit) and show
        # no progress of their own.
        quick = {"concurrency_limit": None, "show_progress": "hidden"}

        def remembered(event):
            """After an event that changes the conversation: the browser keeps the new one."""
            return event.then(h.remember, [chat], [stored], **quick)

        def streaming(trigger, fn, inputs, outputs):
            """A turn that generates a reply: Stop shows for as long as it runs, and is hidden again (whether
            the turn ended, failed or was stopped) once the browser keeps the conversation: a page reloaded
            after that has the whole turn."""
            shown_stop = trigger(lambda: gr.update(visible=True), None, [stop], **quick)
            ran = remembered(shown_stop.then(fn, inputs, outputs))
            return ran.then(lambda: gr.update(visible=False), None, [stop], **quick)

        for trigger in (send.click, box.submit):
            streaming(trigger, h.send, [box, chat, *settings], [box, *turn_out])
        streaming(regen.click, h.regenerate, [chat, *settings], turn_out)
        remembered(undo.click(h.undo, [chat], [box, *turn_out]))
        remembered(chatbot.clear(h.reset, [chat], [box, *turn_out]))
        # Stop sets the session's stop event (the Chat in gr.State is this session's object): the turn's own
        # handler then finishes with the text so far, so the stopped reply is kept, shown and can be rated.
        # (Gradio's cancels= would kill that handler instead and lose the reply.) No concurrency limit: it
        # must run while the turn it stops holds its event's slot.
        stop.click(h.stop, [chat], None, concurrency_limit=None)
        # Every thumb clicked counts, also one clicked while another is still being written: Gradio's default
        # ("once") drops a click made while the event is pending, with nothing on the page to say so. They run in
        # order (the like handler's concurrency limit is 1), and a repeated verdict is recorded once (h.like).
        remembered(chatbot.like(h.like, [chat], [chatbot, chat, status], trigger_mode="multiple"))

        def edit_turn(chat, system, context_turns, temperature, max_new_tokens, data: gr.EditData):
            """h.edit, with Stop shown while an edited question is asked again (the edit's data comes with its
            own event only, so this cannot be a step of a `streaming` chain)."""
            for out in h.edit(chat, system, context_turns, temperature, max_new_tokens, data):
                yield (*out, gr.update(visible=out[-1] == ANSWERING))

        remembered(chatbot.edit(edit_turn, [chat, *settings], [*turn_out, stop]))
        save.click(h.save, [chat, fmt], [saved, status])
        remembered(upload.upload(h.load, [upload, chat, *settings], [chatbot, chat, system_box, status]))
        # On a (re)load: the conversation the browser kept. Also on the stored value's change: the browser
        # reads its storage when the page has mounted, which may come after the load event (a change this
        # session wrote itself is ignored: the session has its Chat by then).
        gr.on([app.load, stored.change], h.restore, [stored, chat], [chatbot, chat, system_box, status])
    return app


def exposure_warning(host: str, password: str | None, share: bool = False) -> str | None:
    """A warning when the page is reachable beyond this machine without a password, else None."""
    if not exposed(host, password, share):
        return None
    where = "through a public share link" if share else f"on {host}, beyond this machine"
    return (
        f"the chat page is served {where} without a password: anyone who reaches it can chat with the model "
        f"and write feedback that is trained on and promoted automatically. Set one (dragon chat-ui "
        f"--password-env NAME)."
    )


def start(app: gr.Blocks, serving: PageServing, warn: bool = True) -> str:
    """Serve the chat page as `serving` says (web.serve: the offline theme, the security headers) and return its
    URL. Without a password, a page reachable beyond this machine gets a warning on stderr (warn=False: the caller
    has said it)."""
    warning = exposure_warning(serving.host, serving.password, serving.share) if warn else None
    return serve(app, CSS, warning, serving, login_name=shown(serving.username))


def launch(
    model: Backend | dict | str,
    store_path: FeedbackStore | str | Path | None,
    serving: PageServing,
    system: str | None = None,
    context_turns: int | None = None,
    model_label: str = "",
    model_name: str = "",
    warn: bool = True,
    **options,
) -> gr.Blocks:
    """Build and serve the chat page for `model` (a model spec, a backend config mapping or a Backend) as `serving`
    says, recording feedback into `store_path` (a store, or a SQLite file's path). `options` go to build_app
    (temperature, max_new_tokens, stream_delay, toolset, tracer). Returns the app (serving in the background when
    serving.block is False)."""
    backend = as_backend(model)
    store = SQLiteFeedbackStore(store_path) if isinstance(store_path, str | Path) else store_path
    app = build_app(backend, store, model_label, model_name, system=system, context_turns=context_turns, **options)
    start(app, serving, warn=warn)
    return app


def serve_target(target: ChatTarget, serving: PageServing, **options) -> gr.Blocks:
    """Serve the chat page on a chat target (chat_target.py: the model, store, system prompt, tools and tracer
    every front end gets the same way) as `serving` says; options go to launch (context_turns, warn ...)."""
    return launch(
        target.model.spec,
        target.store,
        serving=serving,
        system=target.system,
        model_label=target.model.label,
        model_name=target.model.name,
        toolset=target.toolset,
        tracer=target.tracer,
        **options,
    )
