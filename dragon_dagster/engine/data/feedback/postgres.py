"""Chat feedback in PostgreSQL: the store of sqlite.py (the same records, the same refusals, the same schema
version, ids that only grow) in a database that chat servers on several machines share.

Each pipeline's feedback is a schema of the database (`feedback_<pipeline>`) with the SQLite store's two tables,
`messages` and `feedback`, and a `schema_version` row. Creating or upgrading it happens once, under an advisory
lock, whichever process comes first. Version 4 is the first layout kept here; UPGRADES bring an older store to
the current version.

Why each write holds the store's advisory lock until it commits: retraining reads records by id range, up to the
highest id it saw. With concurrent transactions a sequence hands out ids in the order writers ask, not the order
they commit, so a reader could see id 11 committed while 10 is still open, move its watermark to 11 and never read
10. Writers that take the lock before their id commit in id order, as SQLite's BEGIN IMMEDIATE makes them there.
Records are small, so one writer at a time costs little (docs/operations/deployment.md has the figures).

Why ids have no gaps: each record's id is the highest committed id plus one, taken under that same lock, as the
SQLite store's are. A sequence would skip the id of every write that rolls back (a chat server killed mid-write,
a dropped connection) and jump by up to 32 after a server crash, so "records 1..max" would not be how many there
are.

Why each record carries a random `record_key`: over a network a COMMIT can succeed and its reply be lost (the
server restarted, the connection dropped). The write is then retried, and the key makes the retry find the first
write instead of adding a second, so an acknowledged record is stored exactly once.

Connections: one per store object and process, kept between operations (a connection costs a password
exchange) and used by one thread at a time; a broken one is replaced. A store that has never reached its server
fails at once with one message naming the setting (password never shown); once it has, a lost connection
(server restarting, failover) is retried with backoff for up to `timeout` seconds before the error. A killed
writer's open transaction is rolled back by the server: no half record.

Framework-free: nothing here imports Dagster.
"""

from __future__ import annotations

import os
import random
import re
import threading
import time
import uuid
import zlib
from contextlib import contextmanager

from ...outages import StoreUnavailable
from ...text.uris import without_password
from ..feedback_turns import FeedbackError
from .records import MAX_MESSAGE_CHARS, SCHEMA_VERSION, CheckedRecord
from .sql import FeedbackTables, insert_turns, revise

try:  # the `postgres` extra; the error below says so when it is missing
    import psycopg
    from psycopg import sql
except ImportError:  # pragma: no cover - depends on the installation
    psycopg = None

URL_SCHEMES = ("postgresql://", "postgres://")
# libpq failures that retrying cannot fix: a wrong password or user, a database that does not exist
_FATAL_SQLSTATES = {"28P01", "28000", "3D000", "42501"}

MESSAGES_TABLE = """
CREATE TABLE IF NOT EXISTS messages (
    id BIGSERIAL PRIMARY KEY,
    parent BIGINT NOT NULL,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    digest TEXT NOT NULL,
    extra TEXT,
    UNIQUE (parent, digest)
)
"""
FEEDBACK_TABLE = """
CREATE TABLE IF NOT EXISTS feedback (
    id BIGSERIAL PRIMARY KEY,
    conversation_id TEXT NOT NULL,
    turns_id BIGINT REFERENCES messages (id),
    legacy_turns TEXT,
    reply TEXT NOT NULL,
    verdict TEXT NOT NULL CHECK (verdict IN ('up', 'down', 'edit')),
    edited TEXT,
    model TEXT NOT NULL DEFAULT '',
    created TEXT NOT NULL,
    trace_id TEXT,
    record_key TEXT UNIQUE
)
"""
VERSION_TABLE = "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)"
# Version 6 is SQLite's index for counting (sqlite.py IDS_INDEX); here the primary key already serves every read by
# id range (a count is an index-only scan of it), so a version 5 store only takes the new number.
UPGRADES: list[str] = []


def schema_name(name: str) -> str:
    """The PostgreSQL schema that holds one pipeline's feedback."""
    if not name or not re.fullmatch(r"[A-Za-z0-9_.-]{1,50}", name):
        raise FeedbackError(f"a feedback store name must be 1-50 letters, digits, '_', '-' or '.', got {name!r}")
    return f"feedback_{name}"


class StoreUnreachable(StoreUnavailable, FeedbackError):
    """The PostgreSQL server cannot be reached or refuses the connection: one line naming the store, the setting,
    the host and the fix (engine/outages.py)."""


class PostgresFeedbackStore(FeedbackTables):
    """Append-only feedback of the pipeline `name` in the PostgreSQL database at `url`; `setting` is what the
    user set the URL through (named in errors)."""

    MARK = "%s"

    def __init__(
        self,
        url: str,
        name: str,
        timeout: float = 60.0,
        max_message_chars: int | None = MAX_MESSAGE_CHARS,
        setting: str = "the feedback store URL",
        connect_timeout: float = 5.0,
    ):
        if psycopg is None:
            raise FeedbackError(
                f"{setting} is a PostgreSQL URL, which needs psycopg 3: pip install 'dragon-dagster[postgres]'"
            )
        if not str(url).startswith(URL_SCHEMES):
            raise FeedbackError(f"{setting} must be a postgresql:// URL, got {without_password(str(url))!r}")
        self.url = str(url)
        self.name = name
        self.schema = schema_name(name)
        self.timeout = float(timeout)
        self.max_message_chars = max_message_chars
        self.setting = setting
        self.connect_timeout = connect_timeout
        self._ready = False
        # one connection per store object and process, kept between operations and used by one thread at a
        # time: a chat server's many request threads hold one connection, not one each
        self._lock = threading.Lock()
        self._conn, self._pid = None, None
        # one advisory lock per pipeline store, the same number in every process
        self._lock_key = zlib.crc32(f"dragon-feedback:{self.schema}".encode()) - 2**31

    @property
    def where(self) -> str:
        """Where the records are, for people (no password)."""
        return f"{without_password(self.url)} (schema {self.schema})"

    def __repr__(self) -> str:
        return f"PostgresFeedbackStore({without_password(self.url)!r}, {self.name!r})"

    def __reduce__(self):  # picklable for worker processes
        return (
            type(self),
            (self.url, self.name, self.timeout, self.max_message_chars, self.setting, self.connect_timeout),
        )

    # ----------------------------------------------------------------------------------- connections

    def _problem(self, exc: BaseException) -> StoreUnreachable:
        return StoreUnreachable.of(f"the feedback store (schema {self.schema})", self.setting, self.url, str(exc))

    def _connect(self):
        conn = psycopg.connect(self.url, autocommit=True, connect_timeout=max(1, round(self.connect_timeout)))
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(self.schema)))
        return conn

    def _connection(self):
        """The store's connection, opened on first use (and again in a forked child, never sharing the parent's
        socket). Called under self._lock."""
        if self._conn is None or self._conn.closed or self._pid != os.getpid():
            self._conn, self._pid = self._connect(), os.getpid()
        return self._conn

    def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and self._pid == os.getpid():
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - a broken connection may not close cleanly; it is gone either way
                pass

    def _retry(self, work):
        """Run work(conn) on the store's connection, one operation at a time. A lost connection is retried on a
        new one until `timeout` once this store has reached its server; refusals (password, missing database, a
        user that may not create the store's schema) and a server never reached fail at once."""
        deadline = time.monotonic() + self.timeout
        attempt = 0
        while True:
            with self._lock:
                try:
                    return work(self._connection())
                except psycopg.OperationalError as exc:
                    self._drop_connection()
                    fatal = getattr(exc, "sqlstate", None) in _FATAL_SQLSTATES
                    if fatal or not self._ready or time.monotonic() > deadline:
                        raise self._problem(exc) from None
                except psycopg.errors.InsufficientPrivilege as exc:  # a user that does not own its database
                    raise self._problem(exc) from None
            attempt += 1
            time.sleep(min(1.0, 0.02 * 2 ** min(attempt, 6)) * (0.5 + random.random()))

    def _ensure(self) -> None:
        if self._ready:
            return

        def init(conn):
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (self._lock_key,))
                conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.schema)))
                conn.execute(VERSION_TABLE)
                found = conn.execute("SELECT max(version) FROM schema_version").fetchone()[0]
                if found is not None and found > SCHEMA_VERSION:
                    raise FeedbackError(
                        f"{self.where} has feedback schema version {found}; this code reads up to {SCHEMA_VERSION}"
                    )
                if found is None:  # new: the current layout
                    conn.execute(MESSAGES_TABLE)
                    conn.execute(FEEDBACK_TABLE)
                    conn.execute("INSERT INTO schema_version (version) VALUES (%s)", (SCHEMA_VERSION,))
                elif found < SCHEMA_VERSION:  # an older layout: its upgrades, then the version
                    for statement in UPGRADES:
                        conn.execute(statement)
                    conn.execute("UPDATE schema_version SET version = %s", (SCHEMA_VERSION,))

        self._retry(init)
        self._ready = True

    def check(self) -> str:
        """Reach the server and create or check the layout now; where the records are. Raises the clear error
        (StoreUnreachable, naming the setting) when it cannot."""
        self._ensure()
        return self.where

    # ---------------------------------------------------------------------------------------- writes

    def _append(
        self, messages: list[dict], record: CheckedRecord, key: str | None = None, replace: bool = False
    ) -> int:
        """One checked record, under the store's lock until it commits, found again by its key when retried (and
        given this one's verdict, edit, model and time when `replace`: a rater revising a rating)."""
        key = key or uuid.uuid4().hex

        def insert(conn):
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (self._lock_key,))
                done = conn.execute("SELECT id FROM feedback WHERE record_key = %s", (key,)).fetchone()
                if done is not None:  # an earlier attempt committed (its reply lost), or a rating revised
                    if replace:
                        revise(conn, int(done[0]), record, self.MARK)
                    return int(done[0])
                turns_id = insert_turns(conn, messages, self.MARK)
                # the next id under the lock, not the column's sequence: see "Why ids have no gaps" above
                return int(
                    conn.execute(
                        "INSERT INTO feedback (id, conversation_id, turns_id, reply, verdict, edited, model, created, "
                        "trace_id, record_key) VALUES ((SELECT COALESCE(MAX(id), 0) + 1 FROM feedback), "
                        "%s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING id",
                        (record.conversation_id, turns_id, *record[1:], key),
                    ).fetchone()[0]
                )

        return self._retry(insert)

    # ----------------------------------------------------------------------------------------- reads

    @staticmethod
    @contextmanager
    def _snapshot(conn):
        with conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            yield
