"""Every completion is one MLflow trace, and its id is the completion's `id`.

The trace's root span opens when the request is admitted (so a stream's first chunk already carries the id)
and closes with the reply: the messages the model got, the reply (with its tool calls), the version that
answered, the latency, the time to the first token and the token counts, in the same shape as the chat page's
traces (engine/infer/tracing.py), in the served name's experiment (the pipeline's). The server's process tracks at
one URI, set once; traces are written synchronously in a worker thread (MLFLOW_ENABLE_ASYNC_TRACE_LOGGING off),
so a trace is stored by the time anyone can rate its reply, and a completion is never held up by it.

What a rating needs later (the messages, the reply, the version) is kept for the last completions in memory,
and read back from the trace itself after a restart.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field

from ..engine.infer.tracing import SPAN_NAME, openai_reply

log = logging.getLogger("dragon_dagster.serve")
KEEP = 10_000  # completions remembered for their ratings without reading the trace back


@dataclass
class Completion:
    """One answered request, as a rating needs it."""

    id: str
    name: str  # the served name (the pipeline: its experiment, its feedback store)
    version: str  # the version that answered
    messages: list[dict]
    reply: str = ""
    tool_calls: list[dict] = field(default_factory=list)
    user: str = ""
    traced: bool = False
    written: asyncio.Future | None = None  # resolved once the trace is stored

    @property
    def label(self) -> str:
        return f"{self.name}/{self.version}"


class Traces:
    """Opens and closes the completions' traces; remembers the last completions for their ratings."""

    def __init__(self, tracking_uri: str | None, experiment_of):
        self.tracking_uri = tracking_uri
        self.experiment_of = experiment_of  # name -> experiment id (the pipeline's), cached by the caller
        self.completions: OrderedDict[str, Completion] = OrderedDict()
        self.last_error: str | None = None
        if tracking_uri:
            import mlflow

            os.environ["MLFLOW_ENABLE_ASYNC_TRACE_LOGGING"] = "false"  # stored before the reply can be rated
            mlflow.set_tracking_uri(tracking_uri)

    def _remember(self, completion: Completion) -> None:
        self.completions[completion.id] = completion
        while len(self.completions) > KEEP:
            self.completions.popitem(last=False)

    def open(
        self, name: str, version: str, messages: list[dict], user: str, attributes: dict
    ) -> tuple[Completion, object]:
        """A new completion and its open span (None when untraced: the id is then OpenAI's style)."""
        span = None
        if self.tracking_uri:
            try:
                import mlflow
                from mlflow.entities import SpanType

                span = mlflow.start_span_no_context(
                    SPAN_NAME,
                    span_type=SpanType.CHAT_MODEL,
                    inputs={"messages": messages},
                    attributes={"dragon.model": f"{name}/{version}", **attributes},
                    metadata={
                        "mlflow.trace.user": user,
                        "mlflow.trace.session": user,
                        "dragon.model": f"{name}/{version}",
                        "dragon.model_uri": f"models:/{name}/{version}",
                        "dragon.model_version": version,
                        "dragon.served_name": name,
                    },
                    experiment_id=str(self.experiment_of(name)),
                )
                if not span.trace_id or span.trace_id == "MLFLOW_NO_OP_SPAN_TRACE_ID":
                    span = None
            except Exception as exc:  # noqa: BLE001 - tracing never breaks a completion: said
                self.last_error = f"no trace for a completion: {type(exc).__name__}: {exc}"
                log.warning(self.last_error)
                span = None
        completion_id = span.trace_id if span is not None else f"chatcmpl-{uuid.uuid4().hex}"
        completion = Completion(completion_id, name, version, messages, user=user, traced=span is not None)
        self._remember(completion)
        return completion, span

    @staticmethod
    def close(span, completion: Completion, usage: dict, attributes: dict, error: str | None = None) -> None:
        """End the span with the reply (called in a worker thread: it writes the trace)."""
        if span is None:
            return
        try:
            outputs = openai_reply(completion.reply)
            if completion.tool_calls:
                outputs["choices"][0]["message"]["tool_calls"] = completion.tool_calls
            span.set_attributes(
                {
                    "mlflow.chat.tokenUsage": {
                        "input_tokens": usage.get("prompt_tokens", 0),
                        "output_tokens": usage.get("completion_tokens", 0),
                        "total_tokens": usage.get("total_tokens", 0),
                    },
                    **attributes,
                }
            )
            if error:
                from mlflow.entities import SpanStatusCode

                span.set_status(SpanStatusCode.ERROR)
            span.end(outputs=outputs, end_time_ns=time.time_ns())
        except Exception as exc:  # noqa: BLE001 - the completion is answered; its trace is lost and said
            log.warning("the trace of %s was not written: %s: %s", completion.id, type(exc).__name__, exc)

    def find(self, completion_id: str) -> Completion | None:
        """A completion by id: remembered, else read back from its trace (after a restart)."""
        found = self.completions.get(completion_id)
        if found is not None or not self.tracking_uri:
            return found
        try:
            from mlflow.tracing.client import TracingClient

            trace = TracingClient(self.tracking_uri).get_trace(completion_id)
        except Exception:  # noqa: BLE001 - no such trace (or not readable): unknown here
            return None
        meta = trace.info.trace_metadata or {}
        name, version = meta.get("dragon.served_name"), meta.get("dragon.model_version")
        root = next((s for s in trace.data.spans if s.parent_id is None), None)
        if not name or not version or root is None:
            return None  # a trace that is not a served completion
        outputs = root.outputs or {}
        message = ((outputs.get("choices") or [{}])[0]).get("message") or {}
        found = Completion(
            completion_id,
            name,
            version,
            (root.inputs or {}).get("messages") or [],
            message.get("content") or "",
            message.get("tool_calls") or [],
            meta.get("mlflow.trace.user", ""),
            traced=True,
        )
        self._remember(found)
        return found
