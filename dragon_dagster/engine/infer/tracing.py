"""Chat turns as MLflow traces, ratings and edits as MLflow assessments on them.

A `ChatTracer` is what a Chat takes to trace (None: no tracing, and nothing here is imported). Each answered
turn becomes one trace in the pipeline's experiment: a CHAT_MODEL root span whose inputs are the messages the
model got (the system prompt first, OpenAI's {"messages": [...]}) and whose outputs are the reply (an OpenAI
chat completion, so MLflow's UI shows the conversation), with the token counts (`mlflow.chat.tokenUsage`, when
the backend can count them), the latency, and the trace's metadata: the conversation (`mlflow.trace.session`),
the user (`mlflow.trace.user`), the model that answered, its URI and version, the system prompt's version
(`system_prompt_uri`, e.g. prompts:/support-system/3). A rating is a feedback assessment named `thumbs`
(True/False) and an edit an expectation named `edited_reply` (the better text), both with a HUMAN source and
the user id, and with the store's feedback id in their metadata.

Where traces go: MLflow exports traces through one process-wide tracer bound to the global tracking URI. When
the process already tracks at the tracer's URI nothing is swapped; otherwise (`dragon chat` and `dragon chat-ui`
leave the global URI alone, since tests run them in-process) each trace is written with the tracer's URI set only
while the trace is made and flushed, under a lock, and the previous URI (and MLFLOW_TRACKING_URI) put back, so
no other code sees it. Assessments and reads go through clients built on the tracer's URI and touch no global.

Tracing never breaks a chat: a trace that cannot be made is reported in `last_error` and the turn goes on
without a trace id. Nor does it hold one up: before each trace and each assessment the tracking store is asked
once, bounded (engine/outages.py: one request that reads the server's database), because MLflow's client retries a
server that is down, or whose database is down, for about 250 s: that long a turn or a rating would wait, and a
trace's export fails quietly after it. A store that does not answer is one line in `last_error` (the store, the
setting, the host, the fix) and an assessment kept pending, at once. Framework-free: nothing here imports Dagster.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ..data.trace_feedback import EDITED, THUMBS  # what a traces feedback source reads back
from ..outages import StoreUnavailable, check_tracking_store
from ..text.uris import without_password

logger = logging.getLogger(__name__)

__all__ = ["EDITED", "THUMBS", "ChatTracer", "TracingError", "exporting_to"]
FEEDBACK_ID = "dragon.feedback_id"  # an assessment's metadata: the store record it mirrors
SPAN_NAME = "chat_turn"
_GLOBAL_URI = threading.Lock()  # one tracer at a time swaps the process's tracking URI


class TracingError(RuntimeError):
    """A trace or an assessment that could not be written (the message names the tracking URI)."""


@contextlib.contextmanager
def exporting_to(uri: str):
    """MLflow's trace exporter pointed at `uri` for the duration (see the module's docstring): a no-op when the
    process already tracks there; else swapped under a lock, flushed, and put back as it was."""
    import mlflow
    from mlflow.tracking._tracking_service import utils

    if utils._tracking_uri == uri:
        yield
        mlflow.flush_trace_async_logging()  # the next assessment must find the trace
        return
    with _GLOBAL_URI:
        before, env = utils._tracking_uri, os.environ.get("MLFLOW_TRACKING_URI")
        mlflow.set_tracking_uri(uri)
        try:
            yield
            mlflow.flush_trace_async_logging()  # before the exporter bound to uri is reset
        finally:
            mlflow.set_tracking_uri(before)
            if env is None:
                os.environ.pop("MLFLOW_TRACKING_URI", None)
            else:
                os.environ["MLFLOW_TRACKING_URI"] = env


def openai_reply(text: str) -> dict:
    """A reply as an OpenAI chat completion (what MLflow's UI renders as the assistant's message)."""
    return {"object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}


@dataclass
class ChatTracer:
    """Traces a Chat's turns into `experiment_id` at `tracking_uri` (see the module's docstring). `user` is who
    chats (the assessments' source id); `model_uri`/`model_version` name the answering model in the registry
    when it is known; `system_prompt_uri` the system prompt's version in MLflow's Prompt Registry."""

    tracking_uri: str
    experiment_id: str
    user: str = "anonymous"
    model_uri: str | None = None
    model_version: str | None = None
    system_prompt_uri: str | None = None
    setting: str = "the chat's tracking URI"  # what names tracking_uri, for the one line of an outage
    last_error: str | None = None
    pending: list[tuple[str, Any]] = field(default_factory=list)  # assessments not written yet: retried

    def unavailable(self) -> StoreUnavailable | None:
        """The tracking store's outage as one line, asked once within seconds; None when it answers."""
        try:
            check_tracking_store(self.tracking_uri, self.setting)
        except StoreUnavailable as exc:
            return exc
        return None

    # -------------------------------------------------------------------------------------- traces

    def turn(
        self,
        *,
        conversation_id: str,
        messages: list[dict],
        reply: str,
        model: str,
        started_ns: int,
        ended_ns: int | None = None,
        usage: dict | None = None,
        stopped: bool = False,
        attributes: dict | None = None,
    ) -> str | None:
        """Trace one answered turn (messages: what the model got, system first; reply: its answer); its trace
        id, or None (and last_error) when no trace could be written."""
        ended_ns = ended_ns or time.time_ns()
        metadata = {
            "mlflow.trace.session": str(conversation_id),
            "mlflow.trace.user": str(self.user),
            "dragon.model": str(model),
        }
        for key, value in (
            ("dragon.model_uri", self.model_uri),
            ("dragon.model_version", self.model_version),
            ("dragon.system_prompt_uri", self.system_prompt_uri),
        ):
            if value is not None:
                metadata[key] = str(value)
        span_attributes = {
            "dragon.latency_ms": round((ended_ns - started_ns) / 1e6, 3),
            "dragon.stopped": bool(stopped),
            "dragon.model": str(model),
            **(attributes or {}),
        }
        if usage:
            span_attributes["mlflow.chat.tokenUsage"] = usage
        down = self.unavailable()
        if down is not None:
            self.last_error = f"no MLflow trace for this turn: {down}"
            logger.warning(self.last_error)
            return None
        try:
            import mlflow
            from mlflow.entities import SpanType

            with exporting_to(self.tracking_uri):
                span = mlflow.start_span_no_context(
                    SPAN_NAME,
                    span_type=SpanType.CHAT_MODEL,
                    inputs={"messages": messages},
                    attributes=span_attributes,
                    metadata=metadata,
                    experiment_id=str(self.experiment_id),
                    start_time_ns=started_ns,
                )
                span.end(outputs=openai_reply(reply), end_time_ns=ended_ns)
            trace_id = span.trace_id
        except Exception as exc:  # noqa: BLE001 - tracing never breaks a chat: said, not raised
            self.last_error = (
                f"no MLflow trace for this turn ({without_password(self.tracking_uri)}): {type(exc).__name__}: {exc}"
            )
            logger.warning(self.last_error)
            return None
        if not trace_id or trace_id == "MLFLOW_NO_OP_SPAN_TRACE_ID":
            self.last_error = (
                f"MLflow tracing is disabled in this process: no trace sent to {without_password(self.tracking_uri)}"
            )
            return None
        self.last_error = None
        return trace_id

    # --------------------------------------------------------------------------------- assessments

    def assessment(self, verdict: str, edited: str | None = None, feedback_id: int | None = None):
        """The assessment a store record makes: thumbs (up/down) feedback, or an edit's expectation."""
        from mlflow.entities import AssessmentSource, Expectation, Feedback

        source = AssessmentSource(source_type="HUMAN", source_id=str(self.user))
        metadata = {FEEDBACK_ID: str(feedback_id)} if feedback_id is not None else None
        if verdict == "edit":
            return Expectation(name=EDITED, value=edited, source=source, metadata=metadata)
        return Feedback(name=THUMBS, value=verdict == "up", source=source, metadata=metadata)

    def _log(self, trace_id: str, assessment) -> None:
        from mlflow.tracing.client import TracingClient

        TracingClient(self.tracking_uri).log_assessment(trace_id, assessment)

    def assess(self, trace_id: str, verdict: str, edited: str | None = None, feedback_id: int | None = None) -> None:
        """Write a store record's assessment on its trace (after the assessments still pending, retried first).
        A failure keeps it pending and raises a TracingError that names the tracking URI and the trace; a store
        that does not answer (asked first, within seconds) keeps it pending at once, the error its one line."""
        assessment = self.assessment(verdict, edited, feedback_id)
        down = self.unavailable()
        if down is None:
            self._write_pending()
        else:
            self.pending.append((trace_id, assessment))
            raise TracingError(
                f"the {verdict} is saved in the feedback store (#{feedback_id}); its assessment on MLflow trace "
                f"{trace_id} is kept and retried with the next rating: {down}"
            )
        try:
            self._log(trace_id, assessment)
        except Exception as exc:  # noqa: BLE001 - any client or server failure: kept, and said
            self.pending.append((trace_id, assessment))
            raise TracingError(
                f"the {verdict} is saved in the feedback store (#{feedback_id}) but not yet on MLflow trace "
                f"{trace_id}: {without_password(self.tracking_uri)} did not take it ({type(exc).__name__}: "
                f"{str(exc)[:300]}); it is retried with the next rating"
            ) from exc

    def retry_pending(self) -> int:
        """Write the assessments that failed before, in order; how many are still pending."""
        if self.pending and self.unavailable() is not None:
            return len(self.pending)
        return self._write_pending()

    def _write_pending(self) -> int:
        """retry_pending once the store has answered."""
        still = []
        for trace_id, assessment in self.pending:
            if still:  # the server is still failing: keep the order, do not hammer it
                still.append((trace_id, assessment))
                continue
            try:
                self._log(trace_id, assessment)
            except Exception:  # noqa: BLE001 - stays pending
                still.append((trace_id, assessment))
        self.pending = still
        return len(still)
