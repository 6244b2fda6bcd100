"""Inference backends: one small interface over a model in this process and any OpenAI-compatible server.

Everything that generates text outside training (the judge, `dragon generate`, teachers) takes a `Backend`:

- `LocalBackend`: transformers in this process. It keeps the last `keep_loaded` models loaded in a
  module-level cache, so repeated calls pay the model load once (dragonfarm's dragon_backend_local).
- `ServerBackend`: any server that speaks the OpenAI chat completions protocol (`transformers serve`,
  vLLM, Ollama, hosted APIs), with bounded concurrency and retries (dragonfarm's dragon_backend_server).

A conversation is a list of chat messages ({"role": ..., "content": ...}); `chat` returns one reply per
conversation, in order. Framework-free: nothing here imports Dagster.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..spec.settings import DEVICES, DTYPES, Hardware

ROLES = ("system", "user", "assistant", "tool")


class BackendError(RuntimeError):
    """A backend cannot be built, cannot load its model, or its server failed or cannot be reached."""


def as_conversation(item: Any) -> list[dict]:
    """A conversation as a list of {"role", "content"} dicts; a plain string is one user message."""
    if isinstance(item, str):
        return [{"role": "user", "content": item}]
    if not isinstance(item, (list, tuple)) or not item:
        raise BackendError(f"a conversation must be a non-empty list of chat messages or a string, got {item!r:.200}")
    messages = []
    for message in item:
        if not isinstance(message, dict) or message.get("role") not in ROLES or "content" not in message:
            raise BackendError(f"a chat message must be a dict with a role in {ROLES} and a content, "
                               f"got {message!r:.200}")
        messages.append({"role": message["role"], "content": message["content"]})
    return messages


def with_system(conversation: list[dict], system: str | None) -> list[dict]:
    """The conversation with `system` as its first message; a system message already there is replaced
    (several system turns break many chat templates)."""
    if not system:
        return conversation
    rest = conversation[1:] if conversation and conversation[0]["role"] == "system" else conversation
    return [{"role": "system", "content": system}] + rest


class Backend:
    """Chat-style text generation. Subclasses implement `_chat` on already-normalized conversations."""

    @property
    def identity(self) -> str:
        """A stable description of what answers (kind, place, model): cache keys include it."""
        return type(self).__name__

    def chat(self, conversations: list[list[dict]], *, max_new_tokens: int = 256, temperature: float = 0.0,
             top_p: float = 1.0, system: str | None = None) -> list[str]:
        """One reply per conversation, in order. temperature 0 is greedy; `system` is prepended when given."""
        if isinstance(conversations, (str, dict)):
            raise BackendError("chat() takes a list of conversations; wrap a single one in a list")
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise BackendError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
        if temperature < 0 or not 0 < top_p <= 1:
            raise BackendError(f"need temperature >= 0 and 0 < top_p <= 1, got {temperature!r}, {top_p!r}")
        convs = [with_system(as_conversation(c), system) for c in conversations]
        if not convs:
            return []
        replies = self._chat(convs, max_new_tokens=max_new_tokens, temperature=float(temperature),
                             top_p=float(top_p))
        if len(replies) != len(convs):
            raise BackendError(f"{self.identity} returned {len(replies)} replies for {len(convs)} conversations")
        return replies

    def generate(self, prompts: list[str], **kwargs) -> list[str]:
        """Replies to plain user prompts: chat() with one user message each."""
        return self.chat([[{"role": "user", "content": p}] for p in prompts], **kwargs)

    def _chat(self, conversations: list[list[dict]], *, max_new_tokens: int, temperature: float,
              top_p: float) -> list[str]:
        raise NotImplementedError

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
    from ..artifacts import read_manifest

    try:
        return read_manifest(path).get("kind") in ("adapter", "merged_model")
    except (OSError, ValueError):
        return False


class LocalBackend(Backend):
    """transformers in this process. `model` is a preset name, a hub id, a model directory, or an adapter or
    merged-model artifact directory. The last `keep_loaded` models (across all LocalBackends, keyed by
    model, device and dtype) stay loaded; keep_loaded=0 loads for every call and keeps nothing."""

    def __init__(self, model: str, device: str = "auto", dtype: str = "auto", keep_loaded: int = 2,
                 batch_size: int = 8, seed: int = 42):
        if not model or not isinstance(model, (str, Path)):
            raise BackendError(f"LocalBackend needs a model (preset, hub id or directory), got {model!r}")
        if device not in DEVICES or dtype not in DTYPES:
            raise BackendError(f"LocalBackend: device must be one of {DEVICES} and dtype one of {DTYPES}, "
                               f"got {device!r}, {dtype!r}")
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

    def _chat(self, conversations, *, max_new_tokens, temperature, top_p):
        from ..evaluate.replies import generate

        entry = self.loaded()
        with entry["lock"]:  # generate() sets tokenizer padding; one batch at a time per model
            return generate(entry["model"], entry["tokenizer"], conversations, max_new_tokens=max_new_tokens,
                            temperature=temperature, top_p=top_p, batch_size=self.batch_size, seed=self.seed)


# ---------------------------------------------------------------------------------------------- server

RETRY_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})


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


class ServerBackend(Backend):
    """Any OpenAI-compatible chat completions server: `transformers serve`, vLLM, Ollama, hosted APIs.
    Requests run in a thread pool of `concurrency`; connection errors, timeouts, 429 and 5xx are retried
    `retries` times with exponential backoff (backoff, 2*backoff, ...; Retry-After is honoured, up to 60 s)."""

    def __init__(self, base_url: str, model: str, api_key: str | None = None, headers: dict | None = None,
                 timeout: float = 60, retries: int = 3, backoff: float = 0.5, concurrency: int = 4):
        if not model or not isinstance(model, str):
            raise BackendError(f"ServerBackend needs the model name the server knows, got {model!r}")
        if not isinstance(retries, int) or retries < 0 or not isinstance(concurrency, int) or concurrency < 1:
            raise BackendError(f"need retries >= 0 and concurrency >= 1, got {retries!r}, {concurrency!r}")
        self.base_url, self.model = base_url, model
        self.url = chat_completions_url(base_url)
        self.timeout, self.retries, self.backoff, self.concurrency = timeout, retries, backoff, concurrency
        self.headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.headers.update(headers or {})

    @property
    def identity(self) -> str:
        return f"server:{self.url}#{self.model}"

    def _wait(self, attempt: int, retry_after: str | None = None) -> None:
        delay = self.backoff * (2 ** attempt)
        try:
            delay = max(delay, min(float(retry_after), 60.0)) if retry_after else delay
        except ValueError:
            pass
        time.sleep(delay)

    def _one(self, messages: list[dict], max_new_tokens: int, temperature: float, top_p: float) -> str:
        import requests

        payload = {"model": self.model, "messages": messages, "max_tokens": max_new_tokens,
                   "temperature": temperature, "top_p": top_p, "stream": False}
        attempts = self.retries + 1
        for attempt in range(attempts):
            last = attempt == attempts - 1
            try:
                response = requests.post(self.url, json=payload, headers=self.headers, timeout=self.timeout)
            except (requests.ConnectionError, requests.Timeout) as exc:
                if last:
                    raise BackendError(f"cannot reach {self.url} after {attempts} attempt(s): "
                                       f"{type(exc).__name__}: {str(exc)[:300]}") from exc
                self._wait(attempt)
                continue
            except requests.RequestException as exc:
                raise BackendError(f"request to {self.url} failed: {type(exc).__name__}: {str(exc)[:300]}") from exc
            status = response.status_code
            if status in RETRY_STATUS and not last:
                self._wait(attempt, response.headers.get("Retry-After"))
                continue
            if status >= 400:
                tries = f" after {attempts} attempt(s)" if status in RETRY_STATUS else ""
                raise BackendError(f"{self.url} returned HTTP {status}{tries} for model {self.model!r}: "
                                   f"{response.text[:500]}")
            return self._content(response)
        raise AssertionError("unreachable")

    def _content(self, response) -> str:
        status = response.status_code
        try:
            body = response.json()
        except ValueError as exc:
            raise BackendError(f"{self.url} returned HTTP {status} with a body that is not JSON: "
                               f"{response.text[:300]!r}") from exc
        try:
            content = body["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError) as exc:
            raise BackendError(f"{self.url} returned HTTP {status} without choices[0].message.content "
                               f"(not an OpenAI chat completion): {str(body)[:300]}") from exc
        if content is None:  # e.g. a refusal or a tool call only
            return ""
        if isinstance(content, list):  # content parts
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        if not isinstance(content, str):
            raise BackendError(f"{self.url} returned HTTP {status} with a non-text message content: {content!r:.200}")
        return content.strip()

    def _chat(self, conversations, *, max_new_tokens, temperature, top_p):
        if len(conversations) == 1 or self.concurrency == 1:
            return [self._one(c, max_new_tokens, temperature, top_p) for c in conversations]
        pool = ThreadPoolExecutor(max_workers=min(self.concurrency, len(conversations)),
                                  thread_name_prefix="dragon-server")
        try:
            futures = [pool.submit(self._one, c, max_new_tokens, temperature, top_p) for c in conversations]
            replies = [f.result() for f in futures]
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)  # fail fast: queued requests are not sent
            raise
        pool.shutdown(wait=True)
        return replies


# ---------------------------------------------------------------------------------------------- config

_LOCAL_KEYS = ("model", "device", "dtype", "keep_loaded", "batch_size", "seed")
_SERVER_KEYS = ("base_url", "model", "api_key", "api_key_env", "headers", "timeout", "retries", "backoff",
                "concurrency")


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
            raise BackendError(f"server backend: api_key_env names {name}, which is not set in this process's "
                               "environment")
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
