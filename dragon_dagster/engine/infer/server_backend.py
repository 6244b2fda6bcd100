"""`ServerBackend`: any server that speaks the OpenAI chat completions protocol (`dragon serve`, `transformers
serve`, vLLM, Ollama, hosted APIs), through the `openai` client, with bounded concurrency and retries
(dragonfarm's dragon_backend_server). Streams with stream=True. Framework-free: nothing here imports Dagster.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .backend import Backend, BackendError


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
