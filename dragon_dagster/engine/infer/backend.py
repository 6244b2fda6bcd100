"""The interface every inference backend has: chat-style text generation over conversations.

Everything that generates text outside training (the judge, `dragon generate`, teachers, the chat) takes a
`Backend`: local_backend.LocalBackend (transformers in this process) or server_backend.ServerBackend (any
OpenAI-compatible server); backend_registry builds one from config.

A conversation is a list of chat messages (conversation.py); `chat` returns one reply per conversation, in
order. `stream` returns one reply as text chunks while it is generated; a `threading.Event` passed as `stop` ends
it early, keeping what was generated. The chunks join to what `chat` returns for the same request (stripped).

Tools: `chat` and `stream` take `tools` (a pipeline's tool schemas, Toolset.schemas) on a backend that
`supports_tools`, and a conversation may hold tool turns (an assistant turn's tool_calls, a tool turn's name).
LocalBackend renders them with the model's chat template, readied by tools/template.py as in training; the reply
is text, its calls in it (tools/calls.py parses them). A ServerBackend does not: an OpenAI-compatible server
returns calls as structured deltas in its own format, which the chat loop does not read, so tools run only with
a local model (the chat commands say so).
Framework-free: nothing here imports Dagster.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from .conversation import ConversationError, as_conversation, with_system


class BackendError(RuntimeError):
    """A backend cannot be built, cannot load its model, or its server failed or cannot be reached."""


def _check_settings(max_new_tokens: Any, temperature: float, top_p: float) -> None:
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise BackendError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    if temperature < 0 or not 0 < top_p <= 1:
        raise BackendError(f"need temperature >= 0 and 0 < top_p <= 1, got {temperature!r}, {top_p!r}")


def _stripped(chunks: Iterator[str]) -> Iterator[str]:
    """The chunks without the reply's leading and trailing whitespace (chat() strips replies), so joined
    streamed chunks equal the non-streamed reply. Whitespace is held back until text follows it; closing
    this generator closes `chunks` (which stops their generation)."""
    started, pending = False, ""
    try:
        for chunk in chunks:
            text = pending + (chunk if started else chunk.lstrip())
            started = started or bool(text)
            body = text.rstrip()
            pending = text[len(body) :]
            if body:
                yield body
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()


class Backend:
    """Chat-style text generation. Subclasses implement `_chat` on already-normalized conversations; one that
    renders tools sets `supports_tools` and takes `tools=` in `_chat` and `_stream`."""

    supports_tools = False

    @property
    def identity(self) -> str:
        """A stable description of what answers (kind, place, model): cache keys include it."""
        return type(self).__name__

    def chat(
        self,
        conversations: list[list[dict]],
        *,
        max_new_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 1.0,
        system: str | None = None,
        tools: list[dict] | None = None,
    ) -> list[str]:
        """One reply per conversation, in order. temperature 0 is greedy; `system` is prepended when given;
        `tools` are rendered with each conversation (a backend that supports_tools)."""
        if isinstance(conversations, (str, dict)):
            raise BackendError("chat() takes a list of conversations; wrap a single one in a list")
        _check_settings(max_new_tokens, temperature, top_p)
        convs = [self._conversation(c, system) for c in conversations]
        if not convs:
            return []
        replies = self._chat(
            convs,
            max_new_tokens=max_new_tokens,
            temperature=float(temperature),
            top_p=float(top_p),
            **self._tools(tools),
        )
        if len(replies) != len(convs):
            raise BackendError(f"{self.identity} returned {len(replies)} replies for {len(convs)} conversations")
        return replies

    def stream(
        self,
        conversation: list[dict] | str,
        *,
        max_new_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 1.0,
        system: str | None = None,
        stop: threading.Event | None = None,
        tools: list[dict] | None = None,
    ) -> Iterator[str]:
        """One reply to one conversation as text chunks, as they are generated. Setting `stop` (from any
        thread) ends the reply early; the chunks already generated still come. Joined, the chunks are the
        reply chat() gives (leading and trailing whitespace stripped). Closing the iterator early also stops
        the generation. Request errors are raised at the first next()."""
        _check_settings(max_new_tokens, temperature, top_p)
        conv = self._conversation(conversation, system)
        stop = stop if stop is not None else threading.Event()
        return _stripped(
            self._stream(
                conv,
                max_new_tokens=max_new_tokens,
                temperature=float(temperature),
                top_p=float(top_p),
                stop=stop,
                **self._tools(tools),
            )
        )

    def _conversation(self, item: Any, system: str | None) -> list[dict]:
        """A conversation in its one form with `system` first; a backend without tools gets role and content
        only (a server would refuse calls written in the template's form)."""
        try:
            return with_system(as_conversation(item, self.supports_tools), system)
        except ConversationError as exc:
            raise BackendError(str(exc)) from None

    def _tools(self, tools: list[dict] | None) -> dict:
        """The keyword that hands `tools` to _chat/_stream: none without tools, so backends that render none
        keep their signature; a BackendError when this backend cannot render them."""
        if not tools:
            return {}
        if not self.supports_tools:
            raise BackendError(
                f"{self.identity} does not run tools: the pipeline's tools run only with a local model "
                "(chat with --model pointing at a model directory or artifact)"
            )
        return {"tools": list(tools)}

    def usage(self, conversation: list[dict], reply: str, tools: list[dict] | None = None) -> dict | None:
        """A turn's token counts ({"input_tokens", "output_tokens", "total_tokens"}: the conversation as the
        model got it, the reply), or None when this backend cannot count them (a trace then has none)."""
        return None

    def generate(self, prompts: list[str], **kwargs) -> list[str]:
        """Replies to plain user prompts: chat() with one user message each."""
        return self.chat([[{"role": "user", "content": p}] for p in prompts], **kwargs)

    def _chat(
        self, conversations: list[list[dict]], *, max_new_tokens: int, temperature: float, top_p: float
    ) -> list[str]:
        raise NotImplementedError

    def _stream(
        self,
        conversation: list[dict],
        *,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        stop: threading.Event,
        **tools,
    ) -> Iterator[str]:
        """A backend that cannot stream yields its whole reply as one chunk (unless stopped before asking)."""
        if not stop.is_set():
            yield from self._chat(
                [conversation], max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, **tools
            )

    def __repr__(self) -> str:
        return f"<{self.identity}>"
