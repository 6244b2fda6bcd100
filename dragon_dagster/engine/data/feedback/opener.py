"""The one way a setting becomes a feedback store: a postgresql:// URL is the pipeline's schema in that database
(postgres.py), an empty one the pipeline's SQLite file (sqlite.py), anything else a clear error naming the setting."""

from __future__ import annotations

from pathlib import Path

from ...text.uris import without_password
from ..feedback_turns import FeedbackError
from .postgres import URL_SCHEMES, PostgresFeedbackStore
from .sqlite import SQLiteFeedbackStore
from .store import FeedbackStore


def open_feedback_store(
    url: str, pipeline: str, sqlite_path: str | Path, setting: str = "the feedback store URL", timeout: float = 60.0
) -> FeedbackStore:
    """The pipeline's store: in PostgreSQL when `url` is a postgresql:// URL, else (`url` empty) the SQLite file at
    `sqlite_path`. `setting` names where the user gave the URL, for errors; `timeout`: how long a PostgreSQL store,
    once reached, retries a server that went away (a restart) before its error."""
    if not url:
        return SQLiteFeedbackStore(sqlite_path)
    if not url.startswith(URL_SCHEMES):
        raise FeedbackError(
            f"{setting} must be a postgresql://user@host:port/database URL (empty: the SQLite file {sqlite_path}), "
            f"got {without_password(url)!r}"
        )
    return PostgresFeedbackStore(url, pipeline, timeout=timeout, setting=setting)
