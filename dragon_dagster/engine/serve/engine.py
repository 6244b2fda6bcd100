"""What every decoding engine takes and gives: the sampling settings of one request, the chunks of its reply,
and the errors the front turns into HTTP statuses (an engine that is full: 429; a prompt over the context: 413).

An engine decodes many requests at once; the front awaits `stream(...)` once per request and reads chunks until
one carries a `finish_reason`. Leaving the iteration early (a client that went away, a stop string found) stops
that request's decoding and no other's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol


class EngineError(RuntimeError):
    """A request the engine could not decode (the message says why)."""


class EngineBusy(EngineError):
    """The engine's queue is full: try again after `retry_after_s`."""

    def __init__(self, message: str, retry_after_s: float = 1.0):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class PromptTooLong(EngineError):
    """The prompt and the reply's budget do not fit the model's context."""

    def __init__(self, prompt_tokens: int, max_tokens: int, context: int):
        super().__init__(
            f"the prompt is {prompt_tokens} tokens and max_tokens {max_tokens}: together over this model's context "
            f"of {context} tokens; shorten the messages or lower max_tokens"
        )
        self.prompt_tokens, self.max_tokens, self.context = prompt_tokens, max_tokens, context


@dataclass(frozen=True)
class Sampling:
    """One request's decoding: temperature 0 is greedy (the same reply alone or in any batch)."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass
class Chunk:
    """A piece of a reply. The last one has `finish_reason` ("stop" or "length") and the token counts."""

    text: str = ""
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tool_calls: list[dict] = field(default_factory=list)  # an upstream that parsed calls itself (OpenAI's shape)


class Engine(Protocol):
    """A model being served: many requests decoded together."""

    label: str  # what answers: "support/4", or the upstream's name for it
    context_length: int

    def prompt_tokens(self, messages: list[dict], tools: list[dict] | None) -> int:
        """How many tokens the prompt is (raises PromptTooLong-free errors as EngineError)."""
        ...

    def stream(self, messages: list[dict], tools: list[dict] | None, sampling: Sampling) -> AsyncIterator[Chunk]:
        """The reply's chunks, decoded with every other request in flight."""
        ...

    def queue_depth(self) -> int:
        """Requests waiting for a place in the batch."""
        ...

    def close(self) -> None:
        """Stop decoding (requests in flight end) and free the model."""
        ...
