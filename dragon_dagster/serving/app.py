"""The server's routes on FastAPI: /v1/chat/completions (plain and streamed), /v1/models, /v1/feedback,
/health and /metrics.

A completion goes: the caller's key (401), the body (413 past the size limit, 400 for what OpenAI would
refuse), the model by name (404, 503 while loading), the prompt against the context (413), the caller's
limits (429 with Retry-After), the engine's queue (429), then decoding with the other requests in flight, under
the request's time limit. The reply's `model` and the `X-Dragon-Model-Version` header name the version that
answered. Tool calls come back as OpenAI's `tool_calls`, parsed from the reply the way the tool stages parse
them (engine/tools/calls.py); in a stream, text that may start a call is held back until the reply shows
what it is.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import ValidationError

from ..engine.infer.chat_tools import HeldCalls
from ..engine.serve.engine import EngineBusy, EngineError, PromptTooLong, Sampling
from ..engine.tools.calls import parse_calls
from . import feedback as rating
from .access import Key, Keys, Limits
from .metrics import Metrics
from .models import Lease, Models
from .protocol import ChatRequest, ServeError, chunk, completion, usage, validation_error
from .traces import Traces

log = logging.getLogger("dragon_dagster.serve")
VERSION_HEADER = "X-Dragon-Model-Version"


@dataclass(frozen=True)
class Policy:
    """The limits every request meets (dragon serve's options)."""

    max_tokens_cap: int = 1024
    default_max_tokens: int = 256
    body_limit_bytes: int = 1 << 20
    request_timeout_s: float = 300.0


def tool_call_dicts(calls) -> list[dict]:
    return [
        {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
        }
        for c in calls
    ]


class Server:
    """What the routes share."""

    def __init__(
        self, models: Models, keys: Keys, limits: Limits, traces: Traces, stores, policy: Policy, metrics: Metrics
    ):
        self.models, self.keys, self.limits, self.traces = models, keys, limits, traces
        self.stores = stores  # name -> the feedback store of that served name (the pipeline's)
        self.policy, self.metrics = policy, metrics
        self.pending: set[asyncio.Task] = set()

    # ------------------------------------------------------------------------------------------ parsing

    async def body(self, request: Request) -> dict:
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > self.policy.body_limit_bytes:
            raise self._too_big(int(declared))
        raw = await request.body()
        if len(raw) > self.policy.body_limit_bytes:
            raise self._too_big(len(raw))
        try:
            found = json.loads(raw or b"null")
        except json.JSONDecodeError as exc:
            raise ServeError(400, f"the body is not JSON: {exc}", None, "invalid_json") from None
        if not isinstance(found, dict):
            raise ServeError(400, "the body must be a JSON object", None, "invalid_json")
        return found

    def _too_big(self, size: int) -> ServeError:
        return ServeError(
            413,
            f"the body is {size} bytes, over this server's limit of "
            f"{self.policy.body_limit_bytes} (dragon serve --body-limit-kb)",
            None,
            "body_too_large",
        )

    def sampling(self, req: ChatRequest) -> Sampling:
        asked = req.max_completion_tokens or req.max_tokens
        if asked is not None and asked > self.policy.max_tokens_cap:
            param = "max_completion_tokens" if req.max_completion_tokens else "max_tokens"
            raise ServeError(
                400,
                f"{param} is {asked}, over this server's cap of {self.policy.max_tokens_cap} "
                "(dragon serve --max-tokens-cap)",
                param,
                "max_tokens_over_cap",
            )
        return Sampling(
            max_tokens=asked or self.policy.default_max_tokens,
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            stop=tuple(req.stop or ()),
            seed=req.seed,
        )

    # --------------------------------------------------------------------------------------- completions

    async def chat(self, request: Request) -> Response:
        key = self.keys.key(request.headers.get("authorization"), request.client.host if request.client else "?")
        who = key.name
        try:
            req = ChatRequest.model_validate(await self.body(request))
        except ValidationError as exc:
            raise validation_error(exc) from None
        sampling = self.sampling(req)
        user = req.user or who
        lease = self.models.lease(req.model, user)
        try:
            run = self._admit(req, sampling, key, user, lease)
        except BaseException:
            lease.release()
            raise
        await run.begin()  # the queue's and the engine's refusals are HTTP statuses, not errors mid-stream
        headers = {VERSION_HEADER: run.label}
        if req.stream:
            return StreamingResponse(run.events(), media_type="text/event-stream", headers=headers)
        return JSONResponse(await run.whole(), headers=headers)

    def _admit(self, req: ChatRequest, sampling: Sampling, key: Key, user: str, lease: Lease) -> Run:
        served = lease.served
        engine = served.engine
        turns, tools = req.turns(), req.tool_schemas()
        try:
            prompt = engine.prompt_tokens(turns, tools)
        except EngineError as exc:
            raise ServeError(400, str(exc), "messages", "invalid_messages") from None
        if prompt + sampling.max_tokens > engine.context_length:
            raise ServeError(
                413,
                str(PromptTooLong(prompt, sampling.max_tokens, engine.context_length)),
                "messages",
                "context_length_exceeded",
            )
        self.limits.admit(key, prompt)
        done, span = self.traces.open(served.name, served.version, turns, user, {"dragon.key": key.name})
        return Run(self, done, span, lease, key.name, prompt, tools, req, sampling)


class Run:
    """One completion being decoded: as a whole or as server-sent events; traced and counted at its end."""

    def __init__(
        self,
        server: Server,
        done,
        span,
        lease: Lease,
        who: str,
        prompt: int,
        tools,
        req: ChatRequest,
        sampling: Sampling,
    ):
        self.server, self.done, self.span, self.lease = server, done, span, lease
        self.who, self.prompt, self.tools, self.req, self.sampling = who, prompt, tools, req, sampling
        self.started = time.perf_counter()
        self.first: float | None = None
        self.completion_tokens = 0
        self.finish = "stop"
        self.status = 200
        self.error: str | None = None
        self.upstream_calls: list[dict] = []
        self.ended = False
        self.server.metrics.in_flight.inc()

    @property
    def label(self) -> str:
        return self.lease.served.label

    async def begin(self) -> None:
        """Wait for the first piece of the reply (a refusal raises here, before any response is sent)."""
        self._pieces = self.chunks()
        try:
            self._head = await anext(self._pieces)
        except StopAsyncIteration:
            self._head = None
        except ServeError as exc:
            self.status, self.error = exc.status, exc.message
            exc.counted = True
            self.end()
            raise
        except BaseException as exc:
            self.status, self.error = 499, type(exc).__name__
            self.end()
            raise

    async def pieces(self):
        if self._head is not None:
            yield self._head
        async for piece in self._pieces:
            yield piece

    async def chunks(self):
        engine = self.lease.served.engine
        try:
            async with asyncio.timeout(self.server.policy.request_timeout_s):
                async for piece in engine.stream(self.done.messages, self.tools, self.sampling):
                    if self.first is None:
                        self.first = time.perf_counter()
                    if piece.tool_calls:  # an upstream that parsed the calls itself
                        self.upstream_calls = piece.tool_calls
                    if piece.finish_reason:
                        self.finish = piece.finish_reason
                        self.completion_tokens = piece.completion_tokens
                        self.prompt = piece.prompt_tokens or self.prompt
                    yield piece
        except TimeoutError:
            raise ServeError(
                504,
                f"the reply took longer than this server's limit of "
                f"{self.server.policy.request_timeout_s:g} s (dragon serve --request-timeout)",
                None,
                "timeout",
            ) from None
        except EngineBusy as exc:
            raise ServeError(
                429, str(exc), None, "server_busy", {"Retry-After": str(max(1, round(exc.retry_after_s)))}
            ) from None
        except EngineError as exc:
            raise ServeError(500, str(exc), None, "engine_error") from None

    def _calls(self) -> list[dict]:
        if self.upstream_calls:
            return [{"id": c.get("id") or f"call_{uuid.uuid4().hex[:24]}", **c} for c in self.upstream_calls]
        if not self.tools:
            return []
        _, calls, _ = parse_calls(self.done.reply)
        return tool_call_dicts(calls) if calls else []

    async def whole(self) -> dict:
        try:
            parts = [piece.text async for piece in self.pieces()]
            self.done.reply = "".join(parts)
            calls = self._calls()
            self.done.tool_calls = calls
            text = parse_calls(self.done.reply)[0] if calls else self.done.reply
            return completion(
                self.done.id,
                self.label,
                text.strip() if calls else text,
                calls,
                "tool_calls" if calls else self.finish,
                usage(self.prompt, self.completion_tokens),
            )
        except ServeError as exc:
            self.status, self.error = exc.status, exc.message
            raise
        except BaseException as exc:
            self.status, self.error = 499, type(exc).__name__
            raise
        finally:
            self.end()

    async def events(self):
        id_, model = self.done.id, self.label
        held = HeldCalls() if self.tools else None
        try:
            yield chunk(id_, model, {"role": "assistant", "content": ""})
            async for piece in self.pieces():
                self.done.reply += piece.text
                shown = held.add(piece.text) if held is not None else piece.text
                if shown:
                    yield chunk(id_, model, {"content": shown})
            calls = self._calls()
            self.done.tool_calls = calls
            if held is not None and not calls:
                rest = held.rest()
                if rest:
                    yield chunk(id_, model, {"content": rest})
            if calls:
                deltas = [{"index": i, **call} for i, call in enumerate(calls)]
                yield chunk(id_, model, {"tool_calls": deltas})
            yield chunk(id_, model, {}, "tool_calls" if calls else self.finish)
            options = self.req.stream_options
            if options is not None and options.include_usage:
                yield chunk(id_, model, {}, usage=usage(self.prompt, self.completion_tokens), choices=False)
            self.end()
            await self.stored()
            yield "data: [DONE]\n\n"
        except ServeError as exc:
            self.status, self.error = exc.status, exc.message
            yield f"data: {json.dumps(exc.body())}\n\n"
        except BaseException as exc:  # the client went away (cancelled) or a failure: its own request ends
            self.status, self.error = 499, type(exc).__name__
            raise
        finally:
            self.end()

    async def stored(self) -> None:
        """Wait until the completion's trace is written: a reply is acknowledged once it can be rated, by any
        replica (a rating finds the completion by reading its trace)."""
        if self.done.written is not None:
            await asyncio.shield(self.done.written)

    def end(self) -> None:
        """Count, log and trace the request, and release its version (once)."""
        if self.ended:
            return
        self.ended = True
        server, m = self.server, self.server.metrics
        elapsed = time.perf_counter() - self.started
        m.in_flight.dec()
        m.requests.labels(str(self.status), self.label).inc()
        if self.first is not None:
            m.ttft.labels(self.label).observe(self.first - self.started)
            decode_s = time.perf_counter() - self.first
            if self.completion_tokens and decode_s > 0:
                m.tokens_per_s.labels(self.label).observe(self.completion_tokens / decode_s)
        m.output_tokens.labels(self.label).inc(self.completion_tokens)
        server.limits.spent(self.who, self.completion_tokens)
        self.lease.release()
        log.info(
            "%s %s %s %d tokens %.2fs %s",
            self.who,
            self.label,
            self.status,
            self.completion_tokens,
            elapsed,
            self.done.id,
        )
        attributes = {
            "dragon.latency_ms": round(elapsed * 1000, 3),
            "dragon.finish_reason": self.finish,
            "dragon.status": self.status,
        }
        if self.first is not None:
            attributes["dragon.time_to_first_token_ms"] = round((self.first - self.started) * 1000, 3)
        written = asyncio.get_running_loop().run_in_executor(
            None, Traces.close, self.span, self.done, usage(self.prompt, self.completion_tokens), attributes, self.error
        )
        self.done.written = written


def create_app(server: Server) -> FastAPI:
    app = FastAPI(title="dragon serve", docs_url=None, redoc_url=None)

    @app.exception_handler(ServeError)
    async def _serve_error(request: Request, exc: ServeError):
        if not getattr(exc, "counted", False):  # a refusal before any version answered; a Run counts its own
            server.metrics.requests.labels(str(exc.status), "").inc()
        return exc.response()

    @app.exception_handler(404)
    async def _not_found(request: Request, exc):
        return ServeError(404, f"no route {request.method} {request.url.path}", None, "unknown_url").response()

    @app.exception_handler(405)
    async def _not_allowed(request: Request, exc):
        return ServeError(
            405, f"{request.method} is not allowed on {request.url.path}", None, "method_not_allowed"
        ).response()

    @app.get("/health")
    async def health():
        if server.models.ready():
            return {"status": "ok", "models": server.models.listing()}
        return JSONResponse({"status": "loading"}, status_code=503, headers={"Retry-After": "5"})

    @app.get("/metrics")
    async def metrics():
        server.metrics.queue.set(sum(e.queue_depth() for e in server.models.engines()))
        return PlainTextResponse(server.metrics.text(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models(request: Request):
        server.keys.who(request.headers.get("authorization"), request.client.host if request.client else "?")
        return {"object": "list", "data": server.models.listing()}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str, request: Request):
        server.keys.who(request.headers.get("authorization"), request.client.host if request.client else "?")
        for entry in server.models.listing():
            if entry["id"] == model_id:
                return entry
        raise ServeError(404, f"the model {model_id!r} does not exist here", "model", "model_not_found")

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        if not server.models.ready():
            raise ServeError(
                503, "the server is loading its models; try again shortly", None, "loading", {"Retry-After": "5"}
            )
        return await server.chat(request)

    @app.post("/v1/feedback")
    async def feedback(request: Request):
        who = server.keys.who(request.headers.get("authorization"), request.client.host if request.client else "?")
        try:
            given = rating.Rating.model_validate(await server.body(request))
        except ValidationError as exc:
            raise validation_error(exc) from None
        found = await asyncio.to_thread(server.traces.find, given.completion_id)
        if found is None:
            raise ServeError(
                404,
                f"no completion {given.completion_id!r} here: rate a completion's `id` as this server returned it",
                "completion_id",
                "completion_not_found",
            )
        if found.written is not None:
            await asyncio.shield(found.written)  # its trace is stored before the assessment goes on it
        rater = given.user or who
        store = server.stores(found.name)
        record, replaced = await asyncio.to_thread(rating.store_rating, store, found, given, rater)
        server.metrics.feedback.labels(found.label, given.rating).inc()
        mirrored = (
            await asyncio.to_thread(rating.assess, server.traces.tracking_uri, found, given, rater, record)
            if server.traces.tracking_uri
            else "none: this server traces nothing"
        )
        return {
            "object": "feedback",
            "id": record,
            "completion_id": found.id,
            "model": found.label,
            "rating": given.rating,
            "replaced": replaced,
            "assessment": mirrored,
        }

    return app
