"""POST /v1/feedback: a rating of a completion, stored where the retraining sensor reads and mirrored on its trace.

A rating names the completion (`completion_id`, the completion's `id`), says `like` or `dislike`, and may carry
a corrected reply (stored as an edit: the better reply SFT learns from) and a comment (the assessment's
rationale in MLflow). Who rates is the request's `user`, else the API key's name. It is written to the served
name's feedback store (the pipeline's: SQLite by default, PostgreSQL in production) exactly as the chat page
writes its ratings, so the conversation becomes retraining data the same way; the store's record carries the
version that answered and the trace. Then it becomes an assessment on the trace (`thumbs`, or `edited_reply`
for a correction), with the rater as its HUMAN source.

One rater, one completion, one record: the record's key is the completion and the rater, so a second rating
replaces the first in the store (same id) and on the trace (the rater's earlier assessment is removed). The
reply is sent once the store has committed: an acknowledged rating survives the server being killed.
"""

from __future__ import annotations

import logging
from typing import Literal

from pydantic import Field

from ..engine.infer.tracing import EDITED, FEEDBACK_ID, THUMBS
from .protocol import Loose, ServeError
from .traces import Completion

log = logging.getLogger("dragon_dagster.serve")


class Rating(Loose):
    completion_id: str = Field(min_length=1)
    rating: Literal["like", "dislike"]
    correction: str | None = None
    comment: str | None = None
    user: str | None = None


def verdict(rating: Rating) -> tuple[str, str | None]:
    if rating.correction is not None and rating.correction.strip():
        return "edit", rating.correction
    return ("up" if rating.rating == "like" else "down"), None


def store_rating(store, completion: Completion, rating: Rating, rater: str) -> tuple[int, bool]:
    """Write the rating (blocking: run it in a worker thread); (record id, whether it replaced one)."""
    from ..engine.data.feedback_turns import FeedbackError

    chosen, edited = verdict(rating)
    key = f"{completion.id}:{rater}"
    before = store.max_id()
    try:
        record = store.record(
            conversation_id=completion.id,
            turns=completion.messages,
            reply=completion.reply,
            verdict=chosen,
            edited=edited,
            model=f"models:/{completion.label}",
            trace_id=completion.id if completion.traced else None,
            key=key,
            replace=True,
        )
    except (FeedbackError, ValueError) as exc:
        raise ServeError(400, f"the rating cannot be stored: {exc}", "completion_id", "invalid_feedback") from None
    return record, record <= before


def assess(tracking_uri: str, completion: Completion, rating: Rating, rater: str, record: int) -> str:
    """Mirror the stored rating on the completion's trace (blocking); what became of it, for the reply."""
    if not completion.traced:
        return "none: the completion was not traced"
    try:
        import mlflow
        from mlflow.entities import AssessmentSource
        from mlflow.tracing.client import TracingClient

        client = TracingClient(tracking_uri)
        trace = client.get_trace(completion.id)
        for old in trace.info.assessments or []:  # this rater's earlier rating of this completion
            source = getattr(old, "source", None)
            if old.name in (THUMBS, EDITED) and source is not None and source.source_id == rater:
                mlflow.delete_assessment(trace_id=completion.id, assessment_id=old.assessment_id)
        source = AssessmentSource(source_type="HUMAN", source_id=rater)
        metadata = {FEEDBACK_ID: str(record)}
        chosen, edited = verdict(rating)
        if chosen == "edit":
            mlflow.log_expectation(trace_id=completion.id, name=EDITED, value=edited, source=source, metadata=metadata)
        else:
            mlflow.log_feedback(
                trace_id=completion.id,
                name=THUMBS,
                value=chosen == "up",
                source=source,
                rationale=rating.comment,
                metadata=metadata,
            )
    except Exception as exc:  # noqa: BLE001 - stored in the feedback store; the trace's copy failed: said
        log.warning("rating #%s is stored but not on trace %s: %s: %s", record, completion.id, type(exc).__name__, exc)
        return f"not written: {type(exc).__name__}: {str(exc)[:200]}"
    return "logged"
