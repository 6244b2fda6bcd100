"""The built-in engine: one model directory decoded by transformers' continuous batching (paged attention).

A request joins the running batch at the next decoding step and leaves it when its reply ends, so sixteen
clients share each step's matrix products instead of waiting in line. transformers' manager runs one sampling
mode for all its requests, so there are two managers per model: a greedy one (temperature 0: the reply is the
same alone or in any batch, tests/engine/serve/test_batching.py) and a sampling one made on the first sampled
request, which takes each request's temperature and top_p.

The KV cache is sized by `cache_tokens` (pages of `page_size` tokens), not by free memory: transformers sizes
it from a GPU's free memory, and on a CPU its default is so large that a batch ran six times slower than the
same requests one after another (measured here). Requests past `max_batch` running and `max_queue` waiting are
refused at once (EngineBusy: the front's 429), never queued without bound.

Stop strings are the engine's: the reply's text is watched as it is decoded, held back where it could be the
start of a stop string, and the request cancelled where one appears. A reader that leaves early cancels its own
request; the others go on.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from ..config.hardware import Hardware
from .engine import Chunk, EngineBusy, EngineError, PromptTooLong, Sampling

log = logging.getLogger("dragon_dagster")

_ids = itertools.count(1)


@dataclass(frozen=True)
class BatchingOptions:
    """How the built-in engine batches (dragon serve's options of the same names)."""

    max_batch: int = 32  # requests decoded together
    max_queue: int = 64  # requests waiting for a place in the batch; beyond: 429
    cache_tokens: int = 32_768  # the KV cache, in tokens, over all requests in flight
    page_size: int = 64
    prefill_tokens: int = 512  # the most prompt tokens one step reads
    device: str = "auto"
    dtype: str = "auto"


def _held_back(text: str, stops: tuple[str, ...]) -> int:
    """How many of text's last characters could begin a stop string (kept until the next chunk tells)."""
    longest = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), 0, -1):
            if stop.startswith(text[-n:]):
                longest = max(longest, n)
                break
    return longest


class BatchingEngine:
    """Continuous batching over the model at `model_dir` (a plain model directory: a merged model's `model/`)."""

    def __init__(self, model_dir: str | Path, label: str, options: BatchingOptions | None = None):
        from .. import models
        from ..tools.template import TemplateError, prepare

        self.options = options or BatchingOptions()
        self.label = label
        self.model_dir = Path(model_dir)
        hardware = Hardware(device=self.options.device, dtype=self.options.dtype)
        try:
            self.model = models.load_model(str(self.model_dir), hardware)
            self.tokenizer = models.load_tokenizer(str(self.model_dir))
        except (models.ModelError, OSError, ValueError) as exc:
            raise EngineError(f"cannot load {label} from {self.model_dir}: {exc}") from exc
        try:
            self.rendering = prepare(self.tokenizer)  # tools rendered the way the tool stages trained them
        except TemplateError as exc:
            raise EngineError(f"{label}: {exc}") from exc
        config = self.model.config
        self.context_length = int(
            getattr(config, "max_position_embeddings", None) or getattr(self.tokenizer, "model_max_length", 2048)
        )
        self.eos_ids = self._eos_ids()
        self._managers: dict[bool, object] = {}
        self._lock = threading.Lock()
        self._in_flight = 0
        self._waiting = 0
        self._closed = False

    # ------------------------------------------------------------------------------------------ prompts

    def _eos_ids(self) -> list[int]:
        found = self.model.generation_config.eos_token_id
        ids = found if isinstance(found, list) else [found]
        if self.tokenizer.eos_token_id is not None:
            ids.append(self.tokenizer.eos_token_id)
        return sorted({int(i) for i in ids if i is not None})

    def prompt_ids(self, messages: list[dict], tools: list[dict] | None) -> list[int]:
        try:
            text = self.tokenizer.apply_chat_template(
                messages, tools=tools or None, add_generation_prompt=True, tokenize=False
            )
        except Exception as exc:  # noqa: BLE001 - a template's own error, named for the client
            raise EngineError(f"the chat template of {self.label} cannot render these messages: {exc}") from exc
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def prompt_tokens(self, messages: list[dict], tools: list[dict] | None) -> int:
        return len(self.prompt_ids(messages, tools))

    # ----------------------------------------------------------------------------------------- batching

    def _manager(self, greedy: bool):
        """The running manager for this sampling mode, made on first use."""
        with self._lock:
            if self._closed:
                raise EngineError(f"{self.label} is no longer served")
            found = self._managers.get(greedy)
            if found is not None:
                return found
            from transformers import ContinuousBatchingConfig, GenerationConfig

            o = self.options
            generation = GenerationConfig(
                do_sample=not greedy,
                max_new_tokens=256,
                eos_token_id=self.eos_ids,
                pad_token_id=self.tokenizer.pad_token_id,
                # not 1.0: a warper whose default is neutral is not made, and then no request could set it
                **({} if greedy else {"temperature": 0.7, "top_p": 0.99}),
            )
            batching = ContinuousBatchingConfig(
                num_blocks=max(4, o.cache_tokens // o.page_size),
                page_size=o.page_size,
                max_batch_tokens=o.prefill_tokens,
                max_requests_per_batch=o.max_batch,
                per_request_processors=not greedy,
            )
            manager = self.model.init_continuous_batching(
                generation_config=generation, continuous_batching_config=batching
            )
            manager.start()
            self._managers[greedy] = manager
            return manager

    def queue_depth(self) -> int:
        return self._waiting

    def in_flight(self) -> int:
        return self._in_flight

    def _admit(self) -> None:
        o = self.options
        with self._lock:
            if self._in_flight >= o.max_batch + o.max_queue:
                raise EngineBusy(
                    f"{self.label} is decoding {o.max_batch} requests with {o.max_queue} waiting; try again shortly",
                    retry_after_s=1.0,
                )
            self._in_flight += 1
            self._waiting += 1

    async def stream(self, messages: list[dict], tools: list[dict] | None, sampling: Sampling) -> AsyncIterator[Chunk]:
        ids = self.prompt_ids(messages, tools)
        if len(ids) + sampling.max_tokens > self.context_length:
            raise PromptTooLong(len(ids), sampling.max_tokens, self.context_length)
        self._admit()
        started = True
        try:
            manager = self._manager(sampling.greedy)
        except BaseException:
            self._release(started)
            raise
        outputs: asyncio.Queue = asyncio.Queue()
        request_id = f"{self.label}-{next(_ids)}"
        manager.register_result_handler(request_id, outputs.put_nowait)
        kwargs = {} if sampling.greedy else {"temperature": float(sampling.temperature), "top_p": float(sampling.top_p)}
        added = manager.add_request(
            ids, request_id=request_id, max_new_tokens=sampling.max_tokens, streaming=True, **kwargs
        )
        if added is None:
            self._release(started)
            raise EngineBusy(f"{self.label} is not accepting requests right now", retry_after_s=1.0)
        from tokenizers.decoders import DecodeStream

        decoder = DecodeStream([], skip_special_tokens=True)
        raw = self.tokenizer._tokenizer
        done, text, sent, seen = False, "", 0, 0
        try:
            while True:
                output = await outputs.get()
                if started:
                    self._waiting -= 1
                    started = False
                if output.error is not None:
                    raise EngineError(f"{self.label} failed while decoding: {output.error}")
                tokens = output.generated_tokens
                for token in tokens[seen:]:
                    if token in self.eos_ids:
                        continue
                    piece = decoder.step(raw, token)
                    if piece:
                        text += piece
                seen = len(tokens)
                finished = done = output.is_finished()
                cut = self._stop_at(text, sampling.stop)
                if cut is not None:
                    text, finished = text[:cut], True
                    reason = "stop"
                else:
                    reason = (
                        "length" if len(tokens) >= sampling.max_tokens and tokens[-1] not in self.eos_ids else "stop"
                    )
                limit = len(text) if finished else len(text) - _held_back(text, sampling.stop)
                if limit > sent:
                    piece, sent = text[sent:limit], limit
                    if not finished:
                        yield Chunk(piece)
                    else:
                        yield Chunk(piece, reason, len(ids), seen)
                        return
                if finished:
                    yield Chunk("", reason, len(ids), seen)
                    return
        finally:
            if not done:  # the reader left or a stop string ended it: free its place in the batch
                manager.cancel_request(request_id)
            with manager.output_router._lock:
                manager.output_router.result_handlers.pop(request_id, None)
            self._release(started)

    def _release(self, waiting: bool) -> None:
        with self._lock:
            self._in_flight -= 1
            if waiting:
                self._waiting -= 1

    @staticmethod
    def _stop_at(text: str, stops: tuple[str, ...]) -> int | None:
        found = [text.find(s) for s in stops if s and s in text]
        return min(found) if found else None

    def close(self) -> None:
        with self._lock:
            self._closed = True
            managers, self._managers = list(self._managers.values()), {}
        for manager in managers:
            manager.stop(block=True, timeout=10)
