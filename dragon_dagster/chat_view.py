"""How a conversation shows on the chat page: model text made inert (`shown`), the Chatbot's value and thumbs for
a Chat's messages (`view`), the status line's notes, and the context window box's values.

The page shows what a model wrote as text and Markdown, never as HTML: `shown()` escapes every tag, entity,
Markdown image and Mermaid diagram before a message reaches the Chatbot (a reply could otherwise render a form
posting elsewhere or fetch a tracking image); `unshown()` is its exact inverse, for what the Chatbot sends back.
"""

from __future__ import annotations

import os
import re
from typing import Any

# Before gradio is imported: the page must not phone home (offline machines, privacy of a local model).
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import gradio as gr  # noqa: E402

from .engine.infer.chat import Chat  # noqa: E402
from .engine.infer.chat_messages import ChatError, is_answer  # noqa: E402
from .engine.infer.tool_loop import turn_lines  # noqa: E402

# What the page's Markdown renderer (marked, in Gradio's frontend) would turn into live HTML, each replaced by a
# numeric character reference that shows as the same character: a `<` that could open a tag, a comment or an
# autolink; an `&` that could start a character reference (so the model's own "&lt;" shows as written and every
# "&#N;" in the result is ours); the `[` of a Markdown image (the browser would fetch its URL); the `m` of a
# Mermaid fence (Gradio renders those as diagrams whose labels are HTML). Text inside code shows these references
# literally: the price of never depending on where a code block starts and ends. `Chat` keeps the original text.
_UNSAFE = re.compile(r"<(?=[A-Za-z/!?])|&(?=#|[A-Za-z][A-Za-z0-9]{0,31};)|(?<=!)\[|(?<=```)m(?=ermaid)")
_OURS = re.compile(r"&#(38|60|91|109);")


def shown(text: str) -> str:
    """Text as the page shows it: Markdown formatting kept, raw HTML, Markdown images and diagrams inert."""
    return _UNSAFE.sub(lambda m: f"&#{ord(m.group())};", text)


def unshown(text: str) -> str:
    """The inverse of shown(): what the Chatbot sends back (an edited message) as the text it stood for."""
    return _OURS.sub(lambda m: chr(int(m.group(1))), text)


def display(messages: list[dict]) -> list[dict]:
    """The Chatbot value for Chat.messages (the system prompt lives in its own box, not in the list): one Chatbot
    message per chat message, so the Chatbot's indexes are the history's."""
    return [displayed(m) for m in messages]


FEEDBACK_SHOWN = {"up": "Like", "down": "Dislike"}  # a reply's rating as the Chatbot's thumbs show it


def feedback_values(messages: list[dict]) -> list[str | None]:
    """The Chatbot's feedback_value: one entry per run of bot messages (the page groups a turn's tool blocks with
    its answer into one bubble, which has one pair of thumbs), the rating of the answer that ends it."""
    values: list[str | None] = []
    bot = False
    for m in messages:
        if m["role"] == "user":
            bot = False
            continue
        if not bot:
            values.append(None)
            bot = True
        if is_answer(m):
            values[-1] = FEEDBACK_SHOWN.get((m.get("rating") or {}).get("verdict"))
    return values


def view(messages: list[dict], tail: list[dict] | None = None) -> dict:
    """The Chatbot's update for Chat.messages (and `tail`, a reply still being generated): its messages and the
    thumbs each rated reply shows (after a reload or an edit too: the page keeps no thumbs of its own then)."""
    return gr.update(value=display(messages) + (tail or []), feedback_value=feedback_values(messages))


def displayed(message: dict) -> dict:
    """A chat message as the Chatbot shows it: a tool call or result as a titled block (Gradio's metadata title:
    the call line, or which tool answered), so neither reads as the model's answer."""
    if message["role"] == "tool":
        title = f"{message.get('name') or 'the tool'} answered"
    elif message.get("tool_calls"):
        title = "\n".join(turn_lines(message))
    else:
        return {"role": message["role"], "content": shown(message["content"])}
    return {"role": "assistant", "content": shown(message["content"]), "metadata": {"title": shown(title)}}


def error_line(exc: Any) -> str:
    """An error for the status line: its message may quote a server's (HTML) response, so shown as text."""
    return f"**error:** {shown(str(exc))}"


def edited_text(value: Any) -> str:
    """Plain text from what the Chatbot sends back: a string, or content parts ({"type": "text", ...})."""
    if isinstance(value, str):
        return unshown(value)
    if isinstance(value, dict):
        return edited_text(str(value.get("text", value.get("content", ""))))
    if isinstance(value, (list, tuple)):
        return "".join(edited_text(v) for v in value)
    return "" if value is None else str(value)


def plural(n: int, word: str) -> str:
    """`1 message`, `2 messages`, `0 messages`."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def context_note(chat: Chat) -> str:
    """The status line after a turn: how much of the history the model saw, and what the window dropped.
    (Every note starts with "Context": the page's tests wait for it as the sign that a reply has ended.)"""
    usage = chat.context_usage()
    earlier, dropped = max(usage["sent"] - 1, 0), usage["dropped"]
    if dropped:
        sent = (
            "sent no earlier exchange"
            if earlier == 0
            else "sent the last exchange"
            if earlier == 1
            else f"sent the last {earlier} exchanges"
        )
        oldest = "the oldest" if dropped == 1 else f"the {dropped} oldest"
        return f"Context window {usage['context_turns']}: {sent}; **dropped {oldest}**."
    if earlier == 0:
        return "Context: the first exchange, nothing earlier to send."
    if earlier == 1:
        return "Context: the earlier exchange was sent."
    return f"Context: all {earlier} earlier exchanges sent."


ALL = "all"  # the context window box's value for "every earlier exchange"


def window_turns(value: Any) -> int | None:
    """The context window box's value as Chat.context_turns: "all" (or empty) is None, every earlier exchange;
    a whole number N >= 0 is the last N (0: none)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    text = "" if value is None else str(value).strip()
    if text.lower() in ("", ALL):
        return None
    if not re.fullmatch(r"[0-9]{1,9}", text):
        raise ChatError(f"the context window must be {ALL} or a whole number >= 0, not {text[:40]!r}")
    return int(text)


def window_value(context_turns: int | None) -> str:
    """What the context window box shows for Chat.context_turns (None: "all")."""
    return ALL if context_turns is None else str(int(context_turns))


ANSWERING = "_answering… (Stop ends the reply here)_"
