"""MLflow traces with human assessments as a feedback source: any assistant traced by MLflow (this project's chat
or not) whose replies people rated or corrected feeds the same retraining as the feedback store.

`TraceFeedback(tracking_uri, experiment)` reads the experiment's traces and gives the records feedback_rows.py
consumes, with the store's reading interface (`max_id`, `count`, `records(after_id, up_to_id)`), so the
observable source, the sensor and a run's record range work on it unchanged. Each HUMAN assessment on a trace is
one record:

- a feedback named `thumbs` (THUMBS; True/False, or "up"/"down", 1/0) is an 'up' or 'down' on the trace's reply;
- an expectation named `edited_reply` (EDITED; the better reply's text) is an 'edit' of it;

assessments by LLM judges or code, other names, and ones that were overridden (not valid) are not feedback. A
record's conversation is the trace's session (`mlflow.trace.session` metadata, else the trace id), its turns are
the root span's request messages (OpenAI's {"messages": [...]} or a list of messages), its reply the root span's
response (a string, an OpenAI chat completion, or a message {"content": ...}); a trace whose request holds no
messages still gives a record, which usable_records skips and counts as malformed turns.

Record ids: a record range (a run's tag "first-last") and the source's data version need ids that only grow as
feedback arrives and never change for feedback already seen. MLflow gives an assessment a creation time in
milliseconds that later assessments do not precede, so a record's id is that time times 1000 plus its rank among
the assessments made in the same millisecond (ordered by assessment id): increasing with arrival, stable, and
derived from MLflow alone, with no local index to keep in step with the server (a second assessment landing in a
millisecond already read could take a lower rank: at 1000 per millisecond from human raters, not a case to index
for). Framework-free: nothing here imports Dagster.
"""

from __future__ import annotations

import json
from typing import Any

from ..text.uris import without_password

THUMBS = "thumbs"  # the feedback assessment of a rating: True (up) or False (down)
EDITED = "edited_reply"  # the expectation of an edit: the better reply's text
UP = {True, "up", "thumbs_up", "yes", "good"}  # True == 1: a 1 counts too
DOWN = {False, "down", "thumbs_down", "no", "bad"}  # and a 0
PAGE = 500


class TraceSourceError(RuntimeError):
    """The experiment cannot be read (the message names the tracking URI and the experiment)."""


def _messages(value: Any) -> list | Any:
    """A request's chat messages: {"messages": [...]} (OpenAI), a list of messages, or a bare user text."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return [{"role": "user", "content": value}]
    if isinstance(value, dict) and "messages" in value:
        return value["messages"]
    return value


def _reply(value: Any) -> Any:
    """A response's text: a string, an OpenAI chat completion, or a message with content."""
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return value
        return parsed if isinstance(parsed, str) else _reply(parsed)
    if isinstance(value, dict):
        if value.get("choices"):
            return _reply(value["choices"][0].get("message", {}))
        if "content" in value:
            return value["content"]
    return value


def _verdict(assessment, thumbs: str, edited: str) -> tuple[str, str | None] | None:
    """('up'|'down'|'edit', the edited text) for a human assessment that is feedback, else None."""
    source = getattr(assessment, "source", None)
    if source is None or str(source.source_type).upper() != "HUMAN" or getattr(assessment, "valid", True) is False:
        return None
    if assessment.name == thumbs and getattr(assessment, "feedback", None) is not None:
        value = assessment.feedback.value
        value = value.strip().lower() if isinstance(value, str) else value
        if not isinstance(value, (bool, int, str)):
            return None
        return ("up", None) if value in UP else ("down", None) if value in DOWN else None
    if assessment.name == edited and getattr(assessment, "expectation", None) is not None:
        value = assessment.expectation.value
        return ("edit", value) if isinstance(value, str) else None
    return None


class TraceFeedback:
    """The human assessments on an MLflow experiment's traces, as feedback records (see the module's docstring)."""

    def __init__(self, tracking_uri: str, experiment: str, thumbs: str = THUMBS, edited: str = EDITED):
        self.tracking_uri, self.experiment = tracking_uri, experiment
        self.thumbs, self.edited = thumbs, edited

    def __repr__(self) -> str:
        return f"TraceFeedback({without_password(self.tracking_uri)!r}, {self.experiment!r})"

    def _client(self):
        from mlflow import MlflowClient

        return MlflowClient(self.tracking_uri)

    def experiment_id(self) -> str:
        try:
            found = self._client().get_experiment_by_name(self.experiment)
        except Exception as exc:  # noqa: BLE001 - any client failure, said with where
            raise TraceSourceError(
                f"cannot read MLflow experiment {self.experiment!r} at {without_password(self.tracking_uri)}: "
                f"{type(exc).__name__}: {str(exc)[:300]}"
            ) from exc
        if found is None:
            raise TraceSourceError(
                f"feedback.source names MLflow experiment {self.experiment!r}, which "
                f"{without_password(self.tracking_uri)} does not have"
            )
        return found.experiment_id

    def _traces(self, spans: bool):
        client, experiment_id, token = self._client(), self.experiment_id(), None
        try:
            while True:
                page = client.search_traces(
                    locations=[experiment_id], max_results=PAGE, page_token=token, include_spans=spans
                )
                yield from page
                token = page.token
                if not token:
                    return
        except TraceSourceError:
            raise
        except Exception as exc:  # noqa: BLE001 - any client failure, said with where
            raise TraceSourceError(
                f"cannot read the traces of MLflow experiment {self.experiment!r} at "
                f"{without_password(self.tracking_uri)}: {type(exc).__name__}: {str(exc)[:300]}"
            ) from exc

    def _rated(self, spans: bool) -> list[tuple[int, Any, Any, tuple]]:
        """(id, trace, assessment, verdict) for every human rating or edit, in id order."""
        found = []
        for trace in self._traces(spans):
            for a in trace.info.assessments or []:
                verdict = _verdict(a, self.thumbs, self.edited)
                if verdict is not None:
                    found.append((int(a.create_time_ms or 0), str(a.assessment_id or ""), trace, a, verdict))
        found.sort(key=lambda f: (f[0], f[1]))
        out, rank, last = [], 0, None
        for ms, _, trace, a, verdict in found:
            rank = rank + 1 if ms == last else 0
            last = ms
            out.append((ms * 1000 + min(rank, 999), trace, a, verdict))
        return out

    def max_id(self) -> int:
        """The newest record's id (0 without any): the source's data version, a range's upper end."""
        rated = self._rated(spans=False)
        return rated[-1][0] if rated else 0

    def count(self, after_id: int = 0) -> int:
        return sum(1 for r in self._rated(spans=False) if r[0] > int(after_id))

    def records(self, after_id: int = 0, up_to_id: int | None = None) -> list[dict]:
        """Records with after_id < id <= up_to_id, in id order, as the feedback store gives them."""
        out = []
        for record_id, trace, assessment, (verdict, edited) in self._rated(spans=True):
            if record_id <= int(after_id) or (up_to_id is not None and record_id > int(up_to_id)):
                continue
            root = next((s for s in trace.data.spans if s.parent_id is None), None)
            request = root.inputs if root is not None else trace.data.request
            response = root.outputs if root is not None else trace.data.response
            meta = trace.info.trace_metadata or {}
            out.append(
                {
                    "id": record_id,
                    "conversation_id": meta.get("mlflow.trace.session") or trace.info.trace_id,
                    "turns": _messages(request),
                    "reply": _reply(response),
                    "verdict": verdict,
                    "edited": edited,
                    "model": meta.get("dragon.model") or f"mlflow:{self.experiment}",
                    "created": str(assessment.create_time_ms),
                    "trace_id": trace.info.trace_id,
                }
            )
        return out
