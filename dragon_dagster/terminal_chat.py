"""The terminal's chat front end (`dragon chat`): an interactive loop over an engine Chat with slash commands,
printing replies as they are generated (Ctrl-C stops a reply, not the program), with input and output injectable
for tests. The web page's front end is chat_ui.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .engine.data.feedback_turns import FeedbackError
from .engine.infer.backend import BackendError
from .engine.infer.chat import Chat
from .engine.infer.chat_messages import ChatError
from .engine.infer.reply_stream import ReplyStream
from .engine.infer.tool_loop import turn_lines

HELP = """commands:
  /up  /down       rate the last reply (saved as feedback)
  /edit <text>     replace the last reply with better text (saved as feedback)
  /undo            drop the last exchange
  /regen           ask again for the last reply
  /reset           start a new conversation
  /save <path>     write the transcript (.json, or .jsonl as a conversations row)
  /history         show the conversation
  /help            this list
  /quit            leave
anything else is sent to the model (start with // to send a message that begins with /); the reply prints
as it is generated, and Ctrl-C stops it there (what it wrote is kept, and can be rated or edited); with the
pipeline's tools, each call the model makes prints as `-> tool({...})` and its result as `   = ...`"""


def _saved(chat: Chat, verdict: str, feedback_id: int | None) -> str:
    kept = chat.feedback[-1].get("store_error") if chat.feedback else None
    if kept:  # the store is down: one line naming it, the setting, the host and the fix
        return f"kept {verdict}, not stored yet: {kept}"
    said = (
        f"recorded {verdict} (feedback #{feedback_id})"
        if feedback_id is not None
        else f"noted {verdict} (no feedback store: not saved)"
    )
    problem = chat.feedback[-1].get("assessment_error") if chat.feedback else None
    return f"{said}; {problem}" if problem else said


def _print_stream(reply: ReplyStream, print_fn: Callable[..., Any], write_fn: Callable[[str], Any] | None) -> None:
    """Show a reply as it is generated (write_fn gets each chunk) or, without write_fn, whole at the end; each
    tool call and its result on a line of its own as they happen (`-> name({...})`, `   = result`).
    Ctrl-C stops the reply, keeping what it has so far, and the chat goes on."""
    midline = False  # write_fn has written text with no newline after it yet
    try:
        for chunk in reply:
            if isinstance(chunk, dict):  # a tool turn: the text before its calls was written already
                if write_fn is not None and midline:
                    write_fn("\n")
                elif write_fn is None and chunk.get("tool_calls") and chunk.get("content"):
                    print_fn(chunk["content"])
                midline = False
                for line in turn_lines(chunk):
                    print_fn(line)
            elif write_fn is not None:
                write_fn(chunk)
                midline = not chunk.endswith("\n")
    except KeyboardInterrupt:
        reply.close()  # an interrupt in write_fn left the stream suspended: finish it as stopped
    if write_fn is not None:
        write_fn("\n")
    elif reply.text:
        print_fn(reply.text)
    if reply.stopped:
        print_fn("(stopped: reply kept as far as it got)" if reply.text else "(stopped before any reply)")


def _default_writer(print_fn: Callable[..., Any]) -> Callable[[str], Any] | None:
    """Chunks go straight to stdout when printing is the builtin print; an injected print_fn (tests, other
    front ends) gets whole replies unless a write_fn is given too."""
    if print_fn is not print:
        return None
    return lambda text: print(text, end="", flush=True)


def run_terminal(
    chat: Chat,
    input_fn: Callable[[str], str] = input,
    print_fn: Callable[..., Any] = print,
    prompt: str = "you> ",
    write_fn: Callable[[str], Any] | None = None,
) -> Chat:
    """Read lines from input_fn until /quit or end of input: slash commands act on the chat, anything else
    is a message whose reply is printed as it is generated (through write_fn, chunk by chunk; by default to
    stdout when print_fn is print). Ctrl-C during a reply stops that reply; at the prompt it leaves. Errors
    (backend, bad command) are printed and the loop goes on."""
    write_fn = write_fn or _default_writer(print_fn)
    print_fn(f"chatting with {chat.model_label} (/help lists commands)")
    while True:
        try:
            line = input_fn(prompt)
        except (EOFError, KeyboardInterrupt):
            print_fn("")
            return chat
        line = (line or "").strip()
        if not line:
            continue
        try:
            if line.startswith("/") and not line.startswith("//"):
                command, _, arg = line.partition(" ")
                arg = arg.strip()
                if command in ("/quit", "/exit", "/q"):
                    return chat
                if command == "/help":
                    print_fn(HELP)
                elif command in ("/up", "/down"):
                    print_fn(_saved(chat, command[1:], chat.rate(command == "/up")))
                elif command == "/edit":
                    if not arg:
                        print_fn("usage: /edit <better reply text>")
                        continue
                    print_fn(_saved(chat, "edit", chat.edit(arg)))
                elif command == "/undo":
                    removed = chat.undo()
                    print_fn(f"removed {len(removed)} message(s)")
                elif command in ("/regen", "/regenerate"):
                    _print_stream(chat.stream_regenerate(), print_fn, write_fn)
                elif command == "/reset":
                    chat.reset()
                    print_fn("conversation cleared")
                elif command == "/save":
                    if not arg:
                        print_fn("usage: /save <path.json|path.jsonl>")
                        continue
                    print_fn(f"saved to {chat.save(arg)}")
                elif command == "/history":
                    history = chat.history()
                    for m in history:
                        if m["content"] or not m.get("tool_calls"):
                            print_fn(f"[{m['role']}] {m['content']}")
                        for call in turn_lines(m) if m.get("tool_calls") else []:
                            print_fn(call)
                    if not history:
                        print_fn("(empty)")
                else:
                    print_fn(f"unknown command {command}; /help lists commands")
            else:
                _print_stream(chat.stream(line[1:] if line.startswith("//") else line), print_fn, write_fn)
                if chat.last_dropped:
                    print_fn(f"({chat.last_dropped} earlier exchange(s) not sent: context_turns={chat.context_turns})")
                if chat.trace_error:
                    print_fn(f"(not traced: {chat.trace_error})")
        except (ChatError, FeedbackError, BackendError, OSError) as exc:
            print_fn(f"error: {exc}")
