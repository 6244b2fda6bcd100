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

`build_app(backend, store, model_label)` returns the `gr.Blocks`, its events wired to `ChatHandlers`
(chat_handlers.py); `start(app, serving)` serves it as a PageServing
says (page_serving.py: host, port, login, shared with the studio); `launch(model, store_path, serving, ...)` does both
from a model spec, a backend config or a Backend (what `dragon chat-ui` calls).
"""

from __future__ import annotations

import os
from pathlib import Path

# Before gradio is imported: the page must not phone home (offline machines, privacy of a local model).
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import gradio as gr  # noqa: E402

from .chat_handlers import FORMATS, ChatHandlers  # noqa: E402
from .chat_target import ChatTarget  # noqa: E402
from .chat_view import ALL, ANSWERING, shown, window_value  # noqa: E402
from .engine.data.feedback.sqlite import SQLiteFeedbackStore  # noqa: E402
from .engine.data.feedback.store import FeedbackStore  # noqa: E402
from .engine.infer.backend import Backend  # noqa: E402
from .engine.infer.backend_registry import as_backend  # noqa: E402
from .engine.infer.tracing import ChatTracer  # noqa: E402
from .engine.tools.declare import Toolset  # noqa: E402
from .page_serving import PageServing, exposed  # noqa: E402
from .web import serve  # noqa: E402

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
