"""Chat feedback in a SQLite file (dragonfarm's dragon_feedback): the default store, one file per pipeline. What
the records become as training data is data/feedback_rows.py.

The database is in WAL mode with synchronous=FULL, so a write that `record()` acknowledged survives a killed
process, and many writers (threads and processes) can append at once: each write uses its own short-lived
connection with a busy timeout and retries while the database is locked. There is no delete, and one update
only: a record written under a caller's key (`dragon serve`'s feedback: one rater, one completion) takes that
rater's revised verdict in place, so a changed mind is one record, never two.

Turns may include a chat's tool turns (an assistant turn's tool_calls, a tool turn's name: data/feedback_turns.py),
kept in the message's `extra` column as JSON; a plain message has none, and its digest is what version 2 wrote.

Schema versions (PRAGMA user_version): 0/absent is the first layout (each row held its turns as JSON text);
opening such a store migrates it in place, in one transaction, to the current version: ids are kept, each row's
turns go into `messages`, and turns that cannot be converted (not JSON, not a list of role/content messages) are
kept verbatim in `legacy_turns`, so that the datasets skip and count them. Version 2 (messages without `extra`)
gets the column on first use, its rows unchanged. Version 3 gets feedback's `trace_id` column (version 4: the
MLflow trace of the rated reply, when the chat was traced), its rows without one. Version 5 adds `record_key`.
Version 6 adds the index `feedback_ids` (see IDS_INDEX), built when a version 5 store is first opened.
"""

from __future__ import annotations

import json
import random
import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..feedback_turns import FeedbackError
from .records import MAX_MESSAGE_CHARS, SCHEMA_VERSION, CheckedRecord
from .sql import FeedbackTables, insert_turns, revise

MESSAGES_TABLE = """
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    parent INTEGER NOT NULL,          -- the message before this one; 0 for a conversation's first
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    digest TEXT NOT NULL,             -- sha256 of role, content (and extra): finds a message without the text
    extra TEXT,                       -- a tool-call turn's tool_calls, a tool turn's name, as JSON (version 3)
    UNIQUE (parent, digest)
)
"""
FEEDBACK_TABLE = """
CREATE TABLE IF NOT EXISTS {name} (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation_id TEXT NOT NULL,
    turns_id INTEGER REFERENCES messages (id),   -- the last message before the reply
    legacy_turns TEXT,                           -- first-layout turns that could not be converted, verbatim
    reply TEXT NOT NULL,
    verdict TEXT NOT NULL CHECK (verdict IN ('up', 'down', 'edit')),
    edited TEXT,
    model TEXT NOT NULL DEFAULT '',
    created TEXT NOT NULL,
    trace_id TEXT,                               -- the MLflow trace of the rated reply (version 4)
    record_key TEXT UNIQUE                       -- the caller's key: a rating its rater may revise (version 5)
)
"""

# Version 6. A COUNT over an id range (the retraining sensor's `count(after_id)` on every tick) walks every row it
# counts; in the table those rows are B-tree leaves holding the texts (about half a kilobyte each), in an index on
# the id alone about a dozen bytes. SQLite counts over this covering index (EXPLAIN QUERY PLAN: "USING COVERING
# INDEX feedback_ids"): with every record new, 0.1 s instead of 2.9 s at a million records (feedback_scale.py).
IDS_INDEX = "CREATE INDEX IF NOT EXISTS feedback_ids ON feedback (id)"


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def _convertible(text: Any) -> list[dict] | None:
    """First-layout turns text as messages when it is a list of role/content messages, else None."""
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        return None
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(m, dict) and isinstance(m.get("role"), str) and "content" in m for m in value)
    ):
        return None
    return [{"role": m["role"], "content": str(m["content"])} for m in value]


def _migrate_v1(conn: sqlite3.Connection) -> None:
    """First layout (turns as JSON text in each row) to the current one, inside the caller's write transaction."""
    conn.execute(MESSAGES_TABLE)
    conn.execute(FEEDBACK_TABLE.format(name="feedback_v2"))
    seq = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'feedback'").fetchone()
    last = 0
    while True:
        rows = conn.execute(
            "SELECT id, conversation_id, turns, reply, verdict, edited, model, created FROM feedback "
            "WHERE id > ? ORDER BY id LIMIT 500",
            (last,),
        ).fetchall()
        if not rows:
            break
        for fid, conversation_id, turns, reply, verdict, edited, model, created in rows:
            messages = _convertible(turns)
            turns_id = insert_turns(conn, messages) if messages is not None else None
            conn.execute(
                "INSERT INTO feedback_v2 (id, conversation_id, turns_id, legacy_turns, reply, verdict, "
                "edited, model, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    fid,
                    conversation_id,
                    turns_id,
                    None if messages is not None else turns,
                    reply,
                    verdict,
                    edited,
                    model,
                    created,
                ),
            )
        last = rows[-1][0]
    conn.execute("DROP TABLE feedback")
    conn.execute("ALTER TABLE feedback_v2 RENAME TO feedback")
    if seq:  # ids are never reused, even above the highest kept row
        if conn.execute("UPDATE sqlite_sequence SET seq = MAX(seq, ?) WHERE name = 'feedback'", seq).rowcount == 0:
            conn.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('feedback', ?)", seq)


class SQLiteFeedbackStore(FeedbackTables):
    """Append-only feedback in a SQLite file (created, with its parent directory, on first use; a store of an
    older layout is migrated on first use)."""

    def __init__(self, path: str | Path, timeout: float = 60.0, max_message_chars: int | None = MAX_MESSAGE_CHARS):
        self.path = Path(path).expanduser()
        self.timeout = float(timeout)
        self.max_message_chars = max_message_chars
        self._ready = False
        self._lock = threading.Lock()  # serializes this object's writes across threads (processes: SQLite)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.path)!r})"

    @property
    def where(self) -> str:
        """Where the records are, for people."""
        return str(self.path)

    def check(self) -> str:
        """Create or migrate the store now; where the records are."""
        self._ensure()
        return self.where

    def __reduce__(self):  # picklable for worker processes: the lock and readiness are per process
        return (type(self), (self.path, self.timeout, self.max_message_chars))

    # ----------------------------------------------------------------------------------- connections

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None)
        conn.execute(f"PRAGMA busy_timeout = {int(self.timeout * 1000)}")
        conn.execute("PRAGMA synchronous = FULL")
        return conn

    def _retry(self, work):
        """Run work(conn) on a fresh connection, retrying while another writer holds the database."""
        deadline = time.monotonic() + self.timeout
        attempt = 0
        while True:
            conn = None
            try:
                conn = self._connect()
                return work(conn)
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc) or time.monotonic() > deadline:
                    raise
            finally:
                if conn is not None:
                    conn.close()
            attempt += 1
            time.sleep(min(0.5, 0.005 * 2 ** min(attempt, 7)) * (0.5 + random.random()))

    def _ensure(self) -> None:
        if self._ready:
            return

        def init(conn):
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise sqlite3.OperationalError(f"database is locked (journal_mode is {mode}, wanted wal)")
            if conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION:
                return
            conn.execute("BEGIN IMMEDIATE")  # one process creates or migrates; the others then see the current version
            try:
                version = conn.execute("PRAGMA user_version").fetchone()[0]
                if version > SCHEMA_VERSION:
                    raise FeedbackError(
                        f"{self.path} has feedback schema version {version}; this code reads up to {SCHEMA_VERSION}"
                    )
                if version < SCHEMA_VERSION:
                    columns = {row[1] for row in conn.execute("PRAGMA table_info(feedback)")}
                    if "turns" in columns:
                        _migrate_v1(conn)
                    else:
                        conn.execute(MESSAGES_TABLE)
                        conn.execute(FEEDBACK_TABLE.format(name="feedback"))
                    if "extra" not in {row[1] for row in conn.execute("PRAGMA table_info(messages)")}:
                        conn.execute("ALTER TABLE messages ADD COLUMN extra TEXT")  # version 2: plain turns only
                    columns = {row[1] for row in conn.execute("PRAGMA table_info(feedback)")}
                    if "trace_id" not in columns:
                        conn.execute("ALTER TABLE feedback ADD COLUMN trace_id TEXT")  # version 3: untraced rows
                    if "record_key" not in columns:  # version 4: no keys (SQLite adds no UNIQUE column: an index)
                        conn.execute("ALTER TABLE feedback ADD COLUMN record_key TEXT")
                    conn.execute("CREATE UNIQUE INDEX IF NOT EXISTS feedback_record_key ON feedback (record_key)")
                    conn.execute(IDS_INDEX)  # version 5: built from the rows there (one pass, in this transaction)
                    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise

        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._retry(init)
        self._ready = True

    def journal_mode(self) -> str:
        self._ensure()
        return self._retry(lambda conn: conn.execute("PRAGMA journal_mode").fetchone()[0])

    # ---------------------------------------------------------------------------------------- writes

    def _append(
        self, messages: list[dict], record: CheckedRecord, key: str | None = None, replace: bool = False
    ) -> int:
        """One checked record, in one write transaction (BEGIN IMMEDIATE: one writer at a time). A key already
        stored: that record (revised by this one when `replace`)."""

        def insert(conn):
            conn.execute("BEGIN IMMEDIATE")
            try:
                found = conn.execute("SELECT id FROM feedback WHERE record_key = ?", (key,)).fetchone() if key else None
                if found is not None:
                    if replace:
                        revise(conn, int(found[0]), record)
                    conn.execute("COMMIT")
                    return int(found[0])
                turns_id = insert_turns(conn, messages)
                cursor = conn.execute(
                    "INSERT INTO feedback (conversation_id, turns_id, reply, verdict, edited, model, "
                    "created, trace_id, record_key) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (record.conversation_id, turns_id, *record[1:], key),
                )
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            return int(cursor.lastrowid)

        with self._lock:
            return self._retry(insert)

    # ----------------------------------------------------------------------------------------- reads

    @staticmethod
    @contextmanager
    def _snapshot(conn):
        conn.execute("BEGIN")  # a read transaction: one snapshot of the WAL database
        try:
            yield
        finally:
            conn.execute("COMMIT")
