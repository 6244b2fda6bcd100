"""A reply being generated in a chat (`ReplyStream`): its text chunks as they come, the tool calls it makes run
and answered between them, a stop from any thread, and the reply committed to the chat's history (or taken back)
when it ends. The Chat (chat.py) makes one per streamed turn; the stream calls back into it to start, trace, commit
or abort the turn, so it takes the chat as it is and imports nothing of it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

from .chat_tools import HeldCalls, calls_to_run
from .tool_loop import call_turn, run_call


class ReplyStream:
    """A reply being generated: iterate it for text chunks as they arrive (joined: the reply). `stop()`, from
    any thread, ends it early. When iteration ends the reply is in the chat's history: whole, or as far as it
    got with `stopped` True and the message marked stopped. Stopped before any text, the history is left as it
    was (a new turn's user message is taken back); a failed request leaves it as it was too and raises.
    Closing the stream early (`close()`, or Ctrl-C in the reader) counts as a stop. Iterate it once.

    With the chat's tools, a reply that calls them is not shown as text: the stream yields the assistant turn
    with its tool_calls (a dict) before the calls run, then each tool turn (a dict) as its result comes, and the
    next reply's chunks; `text` is the reply being generated now, `turns` the tool turns made so far. They join
    the history with the answer (and are dropped with it when the turn ends without one)."""

    def __init__(self, chat: Any, regenerate: bool, user_text: str = ""):
        self.chat, self.regenerate, self.user_text = chat, regenerate, user_text
        self.text, self.stopped, self.done = "", False, False
        self.turns: list[dict] = []  # tool-call turns and tool turns before the answer
        self._stop = threading.Event()
        self._started = time.time_ns()  # the trace's start: when the turn was asked for
        self._chunks = self._run()

    def __iter__(self) -> ReplyStream:
        return self

    def __next__(self) -> str | dict:
        return next(self._chunks)

    def stop(self) -> None:
        """End the reply at the next token (safe from any thread; nothing happens once it is done)."""
        self._stop.set()

    def close(self) -> None:
        """Stop and finish now: the text so far is kept as a stopped reply."""
        self._stop.set()
        self._chunks.close()

    def _run(self) -> Iterator[str | dict]:
        chat = self.chat
        chat._begin(self)
        self._started = time.time_ns()
        sent, dropped = [], 0
        try:
            sent, dropped = chat._context(chat.messages[: chat.reply_start()] if self.regenerate else chat.messages)
            made = 0  # tool calls run in this turn (the toolset's max_calls bounds them)
            while True:
                held = HeldCalls() if chat.toolset is not None else None
                yield from self._reply(chat, sent + self.turns, held)
                if held is None or self._stop.is_set():
                    break
                text, calls = calls_to_run(held.reply, chat.toolset, made)
                if not calls:  # the answer: what was held back (a call past max_calls, a broken block) is its text
                    rest = held.rest()
                    if rest:
                        self.text += rest
                        yield rest
                    break
                made += len(calls)
                self.text = ""  # what this reply said before its calls is the call turn's text
                self.turns.append(call_turn(text, calls))
                yield self.turns[-1]
                for call in calls:
                    self.turns.append(run_call(chat.toolset, call))
                    yield self.turns[-1]
        except (GeneratorExit, KeyboardInterrupt):  # the reader left or was interrupted: a stop
            self._stop.set()
            self._finish(chat, sent, dropped)
            raise
        except BaseException:
            chat._abort(self)
            raise
        self._finish(chat, sent, dropped)

    def _reply(self, chat: Any, conversation: list[dict], held: HeldCalls | None) -> Iterator[str]:
        """One reply to the conversation, streamed into self.text (what may be shown of it: see HeldCalls)."""
        chunks = chat.backend.stream(
            conversation,
            max_new_tokens=chat.max_new_tokens,
            temperature=chat.temperature,
            top_p=chat.top_p,
            system=chat.system,
            stop=self._stop,
            **chat._tools(),
        )
        try:
            for chunk in chunks:
                shown = held.add(chunk) if held is not None else chunk
                if shown:
                    self.text += shown
                    yield shown
        finally:
            chunks.close()  # ends the generation (a no-op when it has finished)

    def _finish(self, chat: Any, sent: list[dict], dropped: int) -> None:
        self.stopped, self.done = self._stop.is_set(), True
        if not self.text:  # nothing to keep (tool turns without an answer included)
            chat._abort(self)
            return
        reply = {"role": "assistant", "content": self.text, **({"stopped": True} if self.stopped else {})}
        if chat.active is self:  # traced only when the reply joins the history (it is what gets rated)
            trace_id = chat._trace(sent + self.turns, self.text, self._started, stopped=self.stopped)
            if trace_id:
                reply["trace_id"] = trace_id
        chat._commit(self, [*self.turns, reply], sent, dropped)
