"""What a chat turn with the pipeline's tools needs besides the chat itself (infer/chat.py drives the turn).

A reply is streamed while it is generated, but a reply that calls a tool writes the call as a block of text
(`<tool_call>{...}</tool_call>`, tools/calls.py): `HeldCalls` holds the text back from where a block starts (or
may be starting: the tail of a chunk can be the first characters of the tag), so the reader sees the reply's
words and, once the reply has ended, the calls as turns (`-> name({...})`), never the raw block. A reply that
turns out to call nothing gets the held text back. `calls_to_run` says which of a finished reply's calls run:
those that parse, up to the toolset's max_calls for the turn.
"""

from __future__ import annotations

from ..tools.calls import OPEN_TAG, ToolCall, parse_calls
from ..tools.declare import Toolset


class HeldCalls:
    """One reply's text as it streams: `add(chunk)` returns what may be shown now, `rest()` what was held back
    (to show when the reply calls nothing). What is shown is always the start of the reply."""

    def __init__(self) -> None:
        self.reply = ""  # everything generated
        self.shown = 0  # how much of it has been shown

    def add(self, chunk: str) -> str:
        self.reply += chunk
        start = self.reply.find(OPEN_TAG, self.shown)  # nothing shown is part of a tag
        limit = start if start >= 0 else len(self.reply) - _partial_tag(self.reply)
        if limit <= self.shown:
            return ""
        text, self.shown = self.reply[self.shown : limit], limit
        return text

    def rest(self) -> str:
        text, self.shown = self.reply[self.shown :], len(self.reply)
        return text


def _partial_tag(text: str) -> int:
    """How many of text's last characters could begin OPEN_TAG (held back until the next chunk tells)."""
    for n in range(min(len(OPEN_TAG) - 1, len(text)), 0, -1):
        if OPEN_TAG.startswith(text[-n:]):
            return n
    return 0


def calls_to_run(reply: str, toolset: Toolset, made: int) -> tuple[str, list[ToolCall]]:
    """(the reply's text outside its call blocks, the calls to run): none when it calls nothing that parses or
    the turn has made max_calls already (the reply is then the answer, as it is), else at most the room left."""
    text, calls, _ = parse_calls(reply)
    room = toolset.max_calls - made
    return text, calls[: max(room, 0)]
