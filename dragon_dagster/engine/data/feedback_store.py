"""Chat feedback (dragonfarm's dragon_feedback): an append-only SQLite store of ratings and edits. What the
records become as training data is data/feedback_rows.py.

`FeedbackStore` keeps one row per feedback event: a reference to the conversation's turns before the rated
reply, the reply, the verdict ('up', 'down' or 'edit' with the improved text) and which model answered. The
turns are stored once: every message is a row of `messages` pointing at the message before it (a tree of
conversations, identical prefixes shared), and a feedback row names the last message before the reply
(`turns_id`). So rating the 20th reply of a conversation adds one small row, not the 20 exchanges before it.
A single message may hold at most `MAX_MESSAGE_CHARS` characters; longer ones are refused with the length and
the limit.

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
MLflow trace of the rated reply, when the chat was traced), its rows without one. A store cannot be read by code
older than its version.

Framework-free: nothing here imports Dagster.
"""

from __future__ import annotations

import hashlib
import json
import random
import sqlite3
import threading
import time
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .feedback_turns import FeedbackError, check_turns, extras, with_extras

VERDICTS = ("up", "down", "edit")
MAX_MESSAGE_CHARS = 32_000  # the longest single message (a turn, a reply, an edit) the store accepts
SCHEMA_VERSION = 5

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
# a revised rating: row[2:6] of checked_record's row (verdict, edited, model, created), then the record's id
REPLACE = "UPDATE feedback SET verdict = ?, edited = ?, model = ?, created = ? WHERE id = ?"
COLUMNS = (
    "id",
    "conversation_id",
    "turns_id",
    "legacy_turns",
    "reply",
    "verdict",
    "edited",
    "model",
    "created",
    "trace_id",
)


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def too_long(text: str, limit: int | None = MAX_MESSAGE_CHARS, what: str = "a message") -> str | None:
    """The refusal for text over the limit, naming its length and the limit; None when it fits."""
    if limit is None or len(text) <= limit:
        return None
    return f"{what} is {len(text):,} characters long; the limit is {limit:,} characters per message (MAX_MESSAGE_CHARS)"


def checked_record(
    max_message_chars: int | None,
    conversation_id: str,
    turns: list[dict],
    reply: str,
    verdict: str,
    edited: str | None,
    model: str,
    trace_id: str | None,
) -> tuple[list[dict], tuple]:
    """(the turns as messages, the feedback row's values after turns_id: conversation_id, reply, verdict, edited,
    model, created, trace_id), or FeedbackError naming what is wrong: every backend refuses the same records with
    the same words."""

    def check_length(text: str, what: str) -> None:
        problem = too_long(text, max_message_chars, what)
        if problem:
            raise FeedbackError(problem)

    if verdict not in VERDICTS:
        raise FeedbackError(f"verdict must be one of {VERDICTS}, got {verdict!r}")
    if verdict == "edit":
        if not isinstance(edited, str) or not edited.strip():
            raise FeedbackError("an 'edit' needs the improved reply text (non-empty)")
        check_length(edited, "the edited reply")
    elif edited is not None:
        raise FeedbackError(f"edited text goes with verdict 'edit' only, not {verdict!r}")
    if not isinstance(reply, str):
        raise FeedbackError(f"reply must be text, got {reply!r:.200}")
    check_length(reply, "the reply")
    messages = check_turns(turns)
    for i, m in enumerate(messages):
        check_length(m["content"], f"turn {i} ({m['role']})")
    row = (
        str(conversation_id),
        reply,
        verdict,
        edited,
        str(model or ""),
        datetime.now(UTC).isoformat(timespec="microseconds"),
        None if trace_id is None else str(trace_id),
    )
    return messages, row


def message_digest(role: str, content: str, extra: str | None = None) -> str:
    """A plain message's digest is what version 2 wrote, so its stored messages are found again."""
    text = f"{role}\0{content}" if extra is None else f"{role}\0{content}\0{extra}"
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def insert_turns(conn, messages: list[dict], mark: str = "?") -> int:
    """The id of the last of `messages` stored as a chain (inside the caller's write transaction, the only writer
    meanwhile): messages already stored with the same predecessors are reused, so a conversation's earlier turns
    are stored once. `mark`: the driver's parameter mark (sqlite3 '?', psycopg '%s')."""
    find = f"SELECT id FROM messages WHERE parent = {mark} AND digest = {mark}"
    add = f"INSERT INTO messages (parent, role, content, digest, extra) VALUES ({', '.join([mark] * 5)})"
    parent = 0
    for m in messages:
        extra = extras(m)
        digest = message_digest(m["role"], m["content"], extra)
        row = conn.execute(find, (parent, digest)).fetchone()
        if row is None:  # read back rather than the driver's last-row id, which not every driver has
            conn.execute(add, (parent, m["role"], m["content"], digest, extra))
            row = conn.execute(find, (parent, digest)).fetchone()
        parent = int(row[0])
    return parent


class FeedbackRecords:
    """What every backend shares: record() (the same checks, then the backend's `_append` of one checked
    record), and the reads (count, max_id, records) as the same SQL in the driver's parameter mark (MARK), each
    inside the backend's `_snapshot` (one consistent view) and its `_retry`."""

    MARK = "?"
    max_message_chars: int | None = MAX_MESSAGE_CHARS

    def record(
        self,
        conversation_id: str,
        turns: list[dict],
        reply: str,
        verdict: str,
        edited: str | None = None,
        model: str = "",
        trace_id: str | None = None,
        key: str | None = None,
        replace: bool = False,
    ) -> int:
        """Append one feedback event and return its id once it is durably committed. `trace_id` names the
        MLflow trace of the rated reply, when the chat was traced. `key`: the record's own key, for a caller that
        tries again later what failed (a chat keeping a rating while the store is down): a store over a network
        finds a write whose acknowledgement was lost by it and returns that record's id, so the rating is stored
        once. `replace`: a record already stored under `key` takes this one's verdict, edit, model and time (one
        rater revising one rating: still one record, with its id)."""
        messages, row = checked_record(
            self.max_message_chars, conversation_id, turns, reply, verdict, edited, model, trace_id
        )
        self._ensure()
        return self._append(messages, row, key, replace)

    def count(self, after_id: int = 0) -> int:
        """How many records have an id above after_id."""
        self._ensure()
        query = f"SELECT COUNT(*) FROM feedback WHERE id > {self.MARK}"
        return int(self._retry(lambda conn: conn.execute(query, (int(after_id),)).fetchone()[0]))

    def max_id(self) -> int:
        """The highest id committed (0 when empty): a watermark for incremental reads."""
        self._ensure()
        return int(self._retry(lambda conn: conn.execute("SELECT COALESCE(MAX(id), 0) FROM feedback").fetchone()[0]))

    def ratings(self, after_id: int = 0) -> list[dict]:
        """Records after after_id without their turns (id, model, verdict, created), in id order: what a count
        by version needs (engine/evaluate/live_rates.py), read without assembling any conversation."""
        self._ensure()
        query = f"SELECT id, model, verdict, created FROM feedback WHERE id > {self.MARK} ORDER BY id"
        rows = self._retry(lambda conn: conn.execute(query, (int(after_id),)).fetchall())
        return [{"id": int(r[0]), "model": r[1], "verdict": r[2], "created": r[3]} for r in rows]

    def records(self, after_id: int = 0, up_to_id: int | None = None) -> list[dict]:
        """Records with after_id < id <= up_to_id, in id order, with their turns as messages. Turns that could
        not be converted from the first layout come back as stored (parsed when they are JSON, else the
        text), for `usable_records` to skip and count."""
        self._ensure()
        where, args = f"id > {self.MARK}", [int(after_id)]
        if up_to_id is not None:
            where += f" AND id <= {self.MARK}"
            args.append(int(up_to_id))

        def read(conn):
            with self._snapshot(conn):  # the records and their messages as of one moment
                rows = conn.execute(
                    f"SELECT {', '.join(COLUMNS)} FROM feedback WHERE {where} ORDER BY id", args
                ).fetchall()
                nodes = conn.execute(
                    f"WITH RECURSIVE chain(id) AS (SELECT turns_id FROM feedback WHERE {where} AND turns_id IS NOT "
                    f"NULL UNION SELECT m.parent FROM messages m JOIN chain c ON m.id = c.id WHERE m.parent != 0) "
                    f"SELECT id, parent, role, content, extra FROM messages WHERE id IN (SELECT id FROM chain)",
                    args,
                ).fetchall()
            return rows, nodes

        return assemble(*self._retry(read))


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


class FeedbackStore(FeedbackRecords):
    """Append-only feedback in a SQLite file (created, with its parent directory, on first use; a store of the
    first layout is migrated on first use)."""

    def __init__(self, path: str | Path, timeout: float = 60.0, max_message_chars: int | None = MAX_MESSAGE_CHARS):
        self.path = Path(path).expanduser()
        self.timeout = float(timeout)
        self.max_message_chars = max_message_chars
        self._ready = False
        self._lock = threading.Lock()  # serializes this object's writes across threads (processes: SQLite)

    def __repr__(self) -> str:
        return f"FeedbackStore({str(self.path)!r})"

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

    def _append(self, messages: list[dict], row: tuple, key: str | None = None, replace: bool = False) -> int:
        """One checked record, in one write transaction (BEGIN IMMEDIATE: one writer at a time). A key already
        stored: that record (replaced by this one's verdict and edit when `replace`)."""

        def insert(conn):
            conn.execute("BEGIN IMMEDIATE")
            try:
                found = conn.execute("SELECT id FROM feedback WHERE record_key = ?", (key,)).fetchone() if key else None
                if found is not None:
                    if replace:
                        conn.execute(REPLACE, (*row[2:6], int(found[0])))
                    conn.execute("COMMIT")
                    return int(found[0])
                turns_id = insert_turns(conn, messages)
                cursor = conn.execute(
                    "INSERT INTO feedback (conversation_id, turns_id, reply, verdict, edited, model, "
                    "created, trace_id, record_key) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (row[0], turns_id, *row[1:], key),
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


def assemble(rows: list[tuple], nodes: list[tuple]) -> list[dict]:
    """Records from feedback rows (COLUMNS) and the messages of their chains (id, parent, role, content, extra):
    each record's turns as messages. Turns that could not be converted from the first layout come back as stored
    (parsed when they are JSON, else the text)."""
    by_id = {n[0]: n[1:] for n in nodes}
    memo: dict[int, tuple] = {0: ()}

    def chain(node: int) -> tuple | None:
        path = []
        while node not in memo:
            if node not in by_id:
                return None
            path.append(node)
            node = by_id[node][0]
        prefix = memo[node]
        for n in reversed(path):
            prefix = prefix + (by_id[n][1:],)
            memo[n] = prefix
        return prefix

    out = []
    for values in rows:
        record = dict(zip(COLUMNS, values))
        legacy = record.pop("legacy_turns")
        if record["turns_id"] is not None:
            messages = chain(record["turns_id"])
            record["turns"] = None if messages is None else [with_extras(*m) for m in messages]
        else:
            try:
                record["turns"] = json.loads(legacy)
            except (TypeError, ValueError):
                record["turns"] = legacy
        out.append(record)
    return out


def open_feedback_store(where: str | Path, name: str = "", setting: str = "the feedback store"):
    """The store at `where`: a postgresql:// URL (the pipeline `name`'s schema in that database,
    feedback_postgres.py) or a SQLite file's path. `setting` names where the user gave it, for errors."""
    if str(where).startswith(("postgresql://", "postgres://")):
        from .feedback_postgres import PostgresFeedbackStore

        return PostgresFeedbackStore(str(where), name, setting=setting)
    return FeedbackStore(where)
