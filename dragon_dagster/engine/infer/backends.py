"""Inference backends: one small interface over a model in this process and any OpenAI-compatible server.

Everything that generates text outside training (the judge, `dragon generate`, teachers) takes a `Backend`:

- `LocalBackend`: transformers in this process. It keeps the last `keep_loaded` models loaded in a
  module-level cache, so repeated calls pay the model load once (dragonfarm's dragon_backend_local).
- `ServerBackend`: any server that speaks the OpenAI chat completions protocol (`dragon serve`, `transformers
  serve`, vLLM, Ollama, hosted APIs), with bounded concurrency and retries (dragonfarm's dragon_backend_server).

A conversation is a list of chat messages ({"role": ..., "content": ...}); `chat` returns one reply per
conversation, in order. `stream` returns one reply as text chunks while it is generated (local: transformers'
TextIteratorStreamer; servers: the `openai` client with stream=True); a `threading.Event` passed as `stop` ends
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

import contextlib
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..config.hardware import DEVICES, DTYPES, Hardware

ROLES = ("system", "user", "assistant", "tool")
TURN_KEYS = {"assistant": ("tool_calls",), "tool": ("name", "tool_call_id")}  # kept beside role and content


class BackendError(RuntimeError):
    """A backend cannot be built, cannot load its model, or its server failed or cannot be reached."""


def as_conversation(item: Any, tool_keys: bool = True) -> list[dict]:
    """A conversation as a list of {"role", "content"} dicts (with tool_keys, an assistant turn's tool_calls and
    a tool turn's name and tool_call_id kept); a plain string is one user message."""
    if isinstance(item, str):
        return [{"role": "user", "content": item}]
    if not isinstance(item, (list, tuple)) or not item:
        raise BackendError(f"a conversation must be a non-empty list of chat messages or a string, got {item!r:.200}")
    messages = []
    for message in item:
        if not isinstance(message, dict) or message.get("role") not in ROLES or "content" not in message:
            raise BackendError(
                f"a chat message must be a dict with a role in {ROLES} and a content, got {message!r:.200}"
            )
        clean = {"role": message["role"], "content": message["content"]}
        keys = TURN_KEYS.get(message["role"], ()) if tool_keys else ()
        clean.update({k: message[k] for k in keys if message.get(k)})
        messages.append(clean)
    return messages


def with_system(conversation: list[dict], system: str | None) -> list[dict]:
    """The conversation with `system` as its first message; a system message already there is replaced
    (several system turns break many chat templates)."""
    if not system:
        return conversation
    rest = conversation[1:] if conversation and conversation[0]["role"] == "system" else conversation
    return [{"role": "system", "content": system}] + rest


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
        # a backend without tools gets role and content only, as it always did (a server would refuse calls
        # written in the template's form)
        convs = [with_system(as_conversation(c, self.supports_tools), system) for c in conversations]
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
        conv = with_system(as_conversation(conversation, self.supports_tools), system)
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


# ----------------------------------------------------------------------------------------------- local

_LOADED: OrderedDict[tuple[str, str, str], dict] = OrderedDict()  # key -> {"model", "tokenizer", "lock", ...}
_CACHE_LOCK = threading.Lock()
_STATS = {"loads": 0, "hits": 0, "evictions": 0}


def cache_stats() -> dict:
    """How often LocalBackend loaded a model, found it already loaded, or evicted one; what is loaded now."""
    with _CACHE_LOCK:
        return {**_STATS, "loaded": [list(key) for key in _LOADED]}


def clear_cache() -> None:
    """Unload every model LocalBackend keeps and reset the counters."""
    with _CACHE_LOCK:
        _LOADED.clear()
        _STATS.update(loads=0, hits=0, evictions=0)


def _is_artifact(path: Path) -> bool:
    from ..artifacts.manifest import manifest_kind

    return manifest_kind(path) in ("adapter", "merged_model")


class LocalBackend(Backend):
    """transformers in this process. `model` is a preset name, a hub id, a model directory, or an adapter or
    merged-model artifact directory. The last `keep_loaded` models (across all LocalBackends, keyed by
    model, device and dtype) stay loaded; keep_loaded=0 loads for every call and keeps nothing. Tools are
    rendered by the model's chat template, readied once per loaded model by tools/template.prepare (a merged
    model of a pipeline with tools saved it readied already)."""

    supports_tools = True

    def __init__(
        self,
        model: str,
        device: str = "auto",
        dtype: str = "auto",
        keep_loaded: int = 2,
        batch_size: int = 8,
        seed: int = 42,
    ):
        if not model or not isinstance(model, (str, Path)):
            raise BackendError(f"LocalBackend needs a model (preset, hub id or directory), got {model!r}")
        if device not in DEVICES or dtype not in DTYPES:
            raise BackendError(
                f"LocalBackend: device must be one of {DEVICES} and dtype one of {DTYPES}, got {device!r}, {dtype!r}"
            )
        if not isinstance(keep_loaded, int) or keep_loaded < 0:
            raise BackendError(f"keep_loaded must be an integer >= 0, got {keep_loaded!r}")
        path = Path(str(model)).expanduser()
        self.model = str(path.resolve()) if path.exists() else str(model)
        self.device, self.dtype = device, dtype
        self.keep_loaded, self.batch_size, self.seed = keep_loaded, batch_size, seed

    @property
    def identity(self) -> str:
        return f"local:{self.model}"

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.model, self.device, self.dtype)

    def _load(self) -> dict:
        from .. import models

        hardware = Hardware(device=self.device, dtype=self.dtype)
        path = Path(self.model)
        try:
            if path.is_dir() and _is_artifact(path):
                model, tokenizer, description = models.load_artifact_model(path, hardware=hardware)
            else:
                resolved = models.resolve(self.model)
                model, tokenizer = models.load_model(resolved, hardware), models.load_tokenizer(resolved)
                description = f"model {resolved}"
        except (models.ModelError, OSError, ValueError, KeyError) as exc:
            raise BackendError(f"LocalBackend cannot load {self.model!r}: {exc}") from exc
        return {"model": model, "tokenizer": tokenizer, "description": description, "lock": threading.Lock()}

    def loaded(self) -> dict:
        """The loaded model entry, from the cache when it is there (loading once under a lock otherwise)."""
        with _CACHE_LOCK:
            entry = _LOADED.get(self.key)
            if entry is not None:
                _LOADED.move_to_end(self.key)
                _STATS["hits"] += 1
                return entry
            entry = self._load()
            _STATS["loads"] += 1
            if self.keep_loaded > 0:
                _LOADED[self.key] = entry
                while len(_LOADED) > self.keep_loaded:
                    _LOADED.popitem(last=False)
                    _STATS["evictions"] += 1
            return entry

    def rendering(self, entry: dict) -> str:
        """Ready the loaded model's tokenizer to render tools (once), and say how: "native" or "fallback"."""
        from ..tools.template import TemplateError, prepare

        with entry["lock"]:
            if "rendering" not in entry:
                try:
                    entry["rendering"] = prepare(entry["tokenizer"])
                except TemplateError as exc:
                    raise BackendError(f"{self.model}: {exc}") from exc
            return entry["rendering"]

    def usage(self, conversation: list[dict], reply: str, tools: list[dict] | None = None) -> dict | None:
        """Counted with the model's own tokenizer and chat template (the prompt as generation rendered it)."""
        try:
            tokenizer = self.loaded()["tokenizer"]
            text = tokenizer.apply_chat_template(
                as_conversation(conversation), tools=tools or None, add_generation_prompt=True, tokenize=False
            )
            prompt = len(tokenizer(text, add_special_tokens=False)["input_ids"])
            answer = len(tokenizer(reply, add_special_tokens=False)["input_ids"])
        except Exception:  # noqa: BLE001 - counts are for the trace; a template that fails here gives none
            return None
        return {"input_tokens": prompt, "output_tokens": answer, "total_tokens": prompt + answer}

    def _chat(self, conversations, *, max_new_tokens, temperature, top_p, tools=None):
        from .generation import generate

        entry = self.loaded()
        if tools:
            self.rendering(entry)
        with entry["lock"]:  # generate() sets tokenizer padding; one batch at a time per model
            return generate(
                entry["model"],
                entry["tokenizer"],
                conversations,
                max_new_tokens=max_new_tokens,
                temperature=temperature,
                top_p=top_p,
                batch_size=self.batch_size,
                seed=self.seed,
                tools=tools,
            )

    def _stream(self, conversation, *, max_new_tokens, temperature, top_p, stop, tools=None):
        entry = self.loaded()
        if tools:
            self.rendering(entry)
        yield from stream_generate(
            entry["model"],
            entry["tokenizer"],
            conversation,
            stop,
            lock=entry["lock"],
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=self.seed,
            tools=tools,
        )


def _stop_criteria(*events: threading.Event):
    """A StoppingCriteria that ends generation at the next token once any of `events` is set."""
    import torch
    from transformers import StoppingCriteria

    class StopOnEvent(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            stop = any(event.is_set() for event in events)
            return torch.full((input_ids.shape[0],), stop, dtype=torch.bool, device=input_ids.device)

    return StopOnEvent()


# How long a streamed local reply waits for its next token before giving up on the generating thread: far
# beyond any token time, it only keeps a wedged generation from hanging the reader forever.
TOKEN_TIMEOUT_S = 600.0


def stream_generate(
    model,
    tokenizer,
    conversation: list[dict],
    stop: threading.Event,
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int = 42,
    lock: threading.Lock | None = None,
    tools: list[dict] | None = None,
) -> Iterator[str]:
    """One reply as decoded text chunks while model.generate runs in a thread (settings and decoding as in
    evaluate.replies.generate, so the chunks join to the same text). Setting `stop` ends generation at the
    next token; leaving this generator early (close, an exception in the reader) stops it too, and the thread
    is always joined before the generator ends. `lock` (the model's) is held by the generating thread only, so
    a reader that is never resumed (an abandoned web request) cannot keep the model locked beyond one reply.
    tools: the schemas the chat template renders (the tokenizer readied for them)."""
    import torch
    from transformers import StoppingCriteriaList, TextIteratorStreamer

    from . import decode_loop, decode_weights

    text = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True, tools=tools or None)
    inputs = tokenizer([text], return_tensors="pt", add_special_tokens=False).to(next(model.parameters()).device)
    sampling = (
        {"do_sample": True, "temperature": temperature, "top_p": top_p}
        if temperature > 0
        else {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
    )
    streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, timeout=TOKEN_TIMEOUT_S, skip_special_tokens=True)
    failure: list[BaseException] = []
    left = threading.Event()  # the reader is gone: stop without touching the caller's event

    def run() -> None:
        try:
            # the weights evaluate.replies.generate decodes with (CPU: folded, packed), so the text is the same
            with lock or contextlib.nullcontext(), torch.no_grad(), decode_weights.prepared(model, 1):
                torch.manual_seed(seed)
                model.generate(
                    **inputs,
                    max_new_tokens=max_new_tokens,
                    pad_token_id=tokenizer.pad_token_id,
                    custom_generate=decode_loop.decode,  # generate hands its own `streamer` to built-in loops only
                    token_streamer=streamer,
                    **sampling,
                    stopping_criteria=StoppingCriteriaList([_stop_criteria(stop, left)]),
                )
        except BaseException as exc:  # noqa: BLE001 - handed to the reader, which raises it
            failure.append(exc)
            streamer.end()  # the reader waits for the end signal

    thread = threading.Thread(target=run, name="dragon-stream-generate", daemon=True)
    thread.start()
    try:
        for chunk in streamer:
            if chunk:
                yield chunk
    finally:
        left.set()  # a reader that left early must not leave the model generating (or holding its lock)
        thread.join()
    if failure:
        raise BackendError(f"local generation failed: {type(failure[0]).__name__}: {failure[0]}") from failure[0]


# ---------------------------------------------------------------------------------------------- server


def chat_completions_url(base_url: str) -> str:
    """The /v1/chat/completions endpoint for a base URL given with or without /v1 (or as the endpoint)."""
    url = str(base_url or "").strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise BackendError(f"ServerBackend base_url must start with http:// or https://, got {base_url!r}")
    if url.endswith("/chat/completions"):
        return url
    if url.endswith("/v1"):
        return url + "/chat/completions"
    return url + "/v1/chat/completions"


def _openai():
    try:
        import openai
    except ImportError as exc:
        raise BackendError(
            "talking to a model server needs the openai package: pip install openai "
            "(dragon-dagster depends on it; a partial install may lack it)"
        ) from exc
    return openai


def _retried(status: int) -> bool:
    """Whether the openai client retries a response with this status (timeouts, conflicts, rate limits, 5xx)."""
    return status in (408, 409, 429) or status >= 500


def _client_class():
    """openai.OpenAI with this project's retry delays and nothing taken from OPENAI_* environment variables:
    a ServerBackend is often not OpenAI's API, and an OpenAI key, organization or custom header in this
    process's environment must not be sent to a local or third-party server."""
    openai = _openai()

    class Client(openai.OpenAI):
        def __init__(self, *, key: str | None, headers: dict, backoff: float, **kwargs):
            # the SDK insists on a key; without one, requests omit the Authorization header (see request_headers)
            super().__init__(api_key=key or "unused", default_headers=headers, **kwargs)
            self.organization = self.project = None  # not OPENAI_ORG_ID / OPENAI_PROJECT_ID
            self._custom_headers = headers  # not OPENAI_CUSTOM_HEADERS
            self.dragon_backoff = backoff
            keyed = key or any(name.lower() == "authorization" for name in headers)
            # per request, as the SDK wants an omitted Authorization header: then none is sent at all
            self.request_headers = {} if keyed else {"Authorization": openai.Omit()}

        def _calculate_retry_timeout(self, remaining_retries, options, response_headers=None) -> float:
            """backoff, 2*backoff, ... (the SDK's own starts at 0.5 s); a Retry-After is honoured up to 60 s."""
            attempt = max(self.max_retries - remaining_retries, 0)
            delay = self.dragon_backoff * (2 ** min(attempt, 30))
            retry_after = self._parse_retry_after_header(response_headers)
            if retry_after is not None and 0 < retry_after < float("inf"):
                delay = max(delay, min(retry_after, 60.0))
            return delay

    return Client


class ServerBackend(Backend):
    """Any OpenAI-compatible chat completions server: `dragon serve`, `transformers serve`, vLLM, Ollama, hosted
    APIs, through the `openai` client. Requests run in a thread pool of `concurrency`; connection errors,
    timeouts, 408, 409, 429 and 5xx are retried `retries` times with exponential backoff (backoff, 2*backoff, ...;
    Retry-After is honoured, up to 60 s). `timeout` bounds connecting and each read (for a stream: the wait for
    each chunk)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        headers: dict | None = None,
        timeout: float = 60,
        retries: int = 3,
        backoff: float = 0.5,
        concurrency: int = 4,
    ):
        if not model or not isinstance(model, str):
            raise BackendError(f"ServerBackend needs the model name the server knows, got {model!r}")
        if not isinstance(retries, int) or retries < 0 or not isinstance(concurrency, int) or concurrency < 1:
            raise BackendError(f"need retries >= 0 and concurrency >= 1, got {retries!r}, {concurrency!r}")
        self.base_url, self.model = base_url, model
        self.url = chat_completions_url(base_url)
        self.timeout, self.retries, self.backoff, self.concurrency = timeout, retries, backoff, concurrency
        self.api_key, self.headers = api_key, dict(headers or {})
        self._client = None
        self._client_lock = threading.Lock()

    @property
    def identity(self) -> str:
        return f"server:{self.url}#{self.model}"

    def __getstate__(self) -> dict:  # copies and pickles build their own client (and lock)
        return {k: v for k, v in self.__dict__.items() if k not in ("_client", "_client_lock")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _client=None, _client_lock=threading.Lock())

    def client(self):
        """The openai client for this server (built once, shared by the request threads: it is thread-safe)."""
        with self._client_lock:
            if self._client is None:
                self._client = _client_class()(
                    key=self.api_key,
                    headers=self.headers,
                    backoff=self.backoff,
                    base_url=self.url[: -len("/chat/completions")],
                    timeout=self.timeout,
                    max_retries=self.retries,
                )
            return self._client

    def _create(self, messages: list[dict], max_new_tokens: int, temperature: float, top_p: float, stream: bool):
        """The raw HTTP response to one chat completion request (after the client's retries), or a BackendError
        that names the URL and what went wrong."""
        openai = _openai()
        try:
            client = self.client()
            return client.chat.completions.with_raw_response.create(
                model=self.model,
                messages=messages,
                max_tokens=max_new_tokens,
                temperature=temperature,
                top_p=top_p,
                stream=stream,
                extra_headers=client.request_headers,
            )
        except openai.APIStatusError as exc:
            status = exc.status_code
            tries = f" after {self.retries + 1} attempt(s)" if _retried(status) else ""
            raise BackendError(
                f"{self.url} returned HTTP {status}{tries} for model {self.model!r}: {exc.response.text[:500]}"
            ) from exc
        except openai.APIConnectionError as exc:  # refused, reset, DNS, timeouts
            cause = exc.__cause__ or exc
            raise BackendError(
                f"cannot reach {self.url} after {self.retries + 1} attempt(s): "
                f"{type(cause).__name__}: {str(cause)[:300] or exc}"
            ) from exc
        except openai.OpenAIError as exc:
            raise BackendError(f"request to {self.url} failed: {type(exc).__name__}: {str(exc)[:300]}") from exc

    def _one(self, messages: list[dict], max_new_tokens: int, temperature: float, top_p: float) -> str:
        raw = self._create(messages, max_new_tokens, temperature, top_p, stream=False)
        return self._content(raw.http_response)

    def _content(self, response) -> str:
        status = response.status_code
        try:
            body = response.json()
        except ValueError as exc:
            raise BackendError(
                f"{self.url} returned HTTP {status} with a body that is not JSON: {response.text[:300]!r}"
            ) from exc
        try:
            content = body["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError) as exc:
            raise BackendError(
                f"{self.url} returned HTTP {status} without choices[0].message.content "
                f"(not an OpenAI chat completion): {str(body)[:300]}"
            ) from exc
        return self._text(content, status).strip()

    def _text(self, content: Any, status: int) -> str:
        if content is None:  # e.g. a refusal or a tool call only
            return ""
        if isinstance(content, list):  # content parts
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        if not isinstance(content, str):
            raise BackendError(f"{self.url} returned HTTP {status} with a non-text message content: {content!r:.200}")
        return content

    def _chat(self, conversations, *, max_new_tokens, temperature, top_p):
        if len(conversations) == 1 or self.concurrency == 1:
            return [self._one(c, max_new_tokens, temperature, top_p) for c in conversations]
        pool = ThreadPoolExecutor(
            max_workers=min(self.concurrency, len(conversations)), thread_name_prefix="dragon-server"
        )
        try:
            futures = [pool.submit(self._one, c, max_new_tokens, temperature, top_p) for c in conversations]
            replies = [f.result() for f in futures]
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)  # fail fast: queued requests are not sent
            raise
        pool.shutdown(wait=True)
        return replies

    def _stream(self, conversation, *, max_new_tokens, temperature, top_p, stop):
        """Server-sent chunks as they arrive. Retries cover the request up to its response headers; a stream
        that breaks after that is an error (retrying would repeat text already shown). Stopping closes the
        connection, which tells the server to stop generating."""
        raw = self._create(conversation, max_new_tokens, temperature, top_p, stream=True)
        response = raw.http_response
        if "text/event-stream" not in response.headers.get("content-type", ""):
            response.read()  # a server that ignores stream=True answers with one whole completion
            yield self._content(response)
            return
        chunks = raw.parse()
        try:
            yield from self._deltas(chunks, response.status_code, stop)
        finally:
            chunks.close()

    def _deltas(self, chunks, status: int, stop: threading.Event) -> Iterator[str]:
        openai = _openai()
        received = 0
        try:
            for chunk in chunks:
                if stop.is_set():
                    return
                choices = getattr(chunk, "choices", None) or []
                text = self._text(getattr(choices[0].delta, "content", None), status) if choices else ""
                if text:
                    received += len(text)
                    yield text
        except Exception as exc:
            # the SDK's errors, and httpx's transport errors (peer gone, read timeout) that it passes through
            if not isinstance(exc, (openai.OpenAIError, OSError, ValueError)) and type(exc).__module__.split(".")[
                0
            ] not in ("httpx", "httpx2", "httpcore"):
                raise
            cause = exc.__cause__ or exc
            raise BackendError(
                f"the reply stream from {self.url} broke after {received} character(s): "
                f"{type(cause).__name__}: {str(cause)[:300] or exc}"
            ) from exc


# ---------------------------------------------------------------------------------------------- config

_LOCAL_KEYS = ("model", "device", "dtype", "keep_loaded", "batch_size", "seed")
_SERVER_KEYS = (
    "base_url",
    "model",
    "api_key",
    "api_key_env",
    "headers",
    "timeout",
    "retries",
    "backoff",
    "concurrency",
)


def backend_from_dict(d: dict) -> Backend:
    """A backend from config: {"type": "local", "model": ...} or {"type": "server", "base_url": ..., "model": ...}.
    Without "type", a "base_url" (or "url") means a server. Unknown keys are named, not ignored."""
    if not isinstance(d, dict):
        raise BackendError(f"a backend config must be a mapping, got {d!r:.200}")
    values = dict(d)
    if "url" in values and "base_url" not in values:
        values["base_url"] = values.pop("url")
    kind = values.pop("type", "server" if "base_url" in values else "local")
    known = {"local": _LOCAL_KEYS, "server": _SERVER_KEYS}.get(kind)
    if known is None:
        raise BackendError(f"backend type must be 'local' or 'server', got {kind!r}")
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise BackendError(f"{kind} backend: unknown setting(s) {unknown}; known: {sorted(known)}")
    required = ("model",) if kind == "local" else ("base_url", "model")
    missing = [k for k in required if not values.get(k)]
    if missing:
        raise BackendError(f"{kind} backend needs {', '.join(missing)}")
    if values.get("api_key_env"):  # the key itself stays in the environment: never in a file, a log or MLflow
        name = values.pop("api_key_env")
        if not os.environ.get(name):
            raise BackendError(
                f"server backend: api_key_env names {name}, which is not set in this process's environment"
            )
        values["api_key"] = os.environ[name]
    return LocalBackend(**values) if kind == "local" else ServerBackend(**values)


def as_backend(spec: Backend | dict | str) -> Backend:
    """A Backend as given, from a config mapping, or a LocalBackend for a model spec string."""
    if isinstance(spec, Backend):
        return spec
    if isinstance(spec, dict):
        return backend_from_dict(spec)
    if isinstance(spec, (str, Path)):
        return LocalBackend(str(spec))
    raise BackendError(f"a backend must be a Backend, a config mapping or a model spec, got {spec!r:.200}")
