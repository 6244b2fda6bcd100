"""Chat feedback as training data (dragonfarm's dragon_feedback): an append-only SQLite store of ratings and
edits, and the two datasets it turns into.

`FeedbackStore` keeps one row per feedback event: the conversation's turns before the rated reply, the reply,
the verdict ('up', 'down' or 'edit' with the improved text) and which model answered. The database is in WAL
mode with synchronous=FULL, so a write that `record()` acknowledged survives a killed process, and many
writers (threads and processes) can append at once: each write uses its own short-lived connection with a
busy timeout and retries while the database is locked. There is no update or delete: history is the data.

- `sft_conversations(records)`: replies people liked or edited, with the turns that led to them, as
  conversations ({"messages": [...]}, the edited text replacing the reply); `data.conversation_row` turns
  one into a prompt-completion training row.
- `preference_pairs(records)`: for prompts (the same turns) that got both a liked-or-edited reply and a
  disliked one, {"prompt", "chosen", "rejected"} in TRL's conversational preference format; every edit also
  gives the pair (chosen=edited text, rejected=the original reply).

Both are deterministic: records are taken in id order, so the same records give the same output.
Framework-free: nothing here imports Dagster.
"""

from __future__ import annotations

import json
import random
import sqlite3
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

VERDICTS = ("up", "down", "edit")
ROLES = ("system", "user", "assistant")

SCHEMA = """
CREATE TABLE IF NOT EXISTS feedback (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation_id TEXT NOT NULL,
    turns TEXT NOT NULL,
    reply TEXT NOT NULL,
    verdict TEXT NOT NULL CHECK (verdict IN ('up', 'down', 'edit')),
    edited TEXT,
    model TEXT NOT NULL DEFAULT '',
    created TEXT NOT NULL
)
"""
COLUMNS = ("id", "conversation_id", "turns", "reply", "verdict", "edited", "model", "created")


class FeedbackError(ValueError):
    """Feedback that cannot be recorded (bad verdict, empty edit, malformed turns)."""


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def check_turns(turns: Any) -> list[dict]:
    """The turns before a reply as clean role/content messages; they must include a user turn."""
    if isinstance(turns, str):
        turns = json.loads(turns)
    if not isinstance(turns, (list, tuple)) or not turns:
        raise FeedbackError(f"turns must be a non-empty list of chat messages, got {turns!r:.200}")
    clean = []
    for message in turns:
        if not isinstance(message, dict) or message.get("role") not in ROLES or "content" not in message:
            raise FeedbackError(f"a chat message must be a dict with a role in {ROLES} and a content, "
                                f"got {message!r:.200}")
        clean.append({"role": message["role"], "content": str(message["content"])})
    if not any(m["role"] == "user" for m in clean):
        raise FeedbackError("turns must include a user turn")
    return clean


class FeedbackStore:
    """Append-only feedback in a SQLite file (created, with its parent directory, on first use)."""

    def __init__(self, path: str | Path, timeout: float = 60.0):
        self.path = Path(path).expanduser()
        self.timeout = float(timeout)
        self._ready = False
        self._lock = threading.Lock()  # serializes this object's writes across threads (processes: SQLite)

    def __repr__(self) -> str:
        return f"FeedbackStore({str(self.path)!r})"

    def __reduce__(self):  # picklable for worker processes: the lock and readiness are per process
        return (type(self), (self.path, self.timeout))

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
            conn.execute(SCHEMA)

        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._retry(init)
        self._ready = True

    def journal_mode(self) -> str:
        self._ensure()
        return self._retry(lambda conn: conn.execute("PRAGMA journal_mode").fetchone()[0])

    # ---------------------------------------------------------------------------------------- writes

    def record(self, conversation_id: str, turns: list[dict], reply: str, verdict: str,
               edited: str | None = None, model: str = "") -> int:
        """Append one feedback event and return its id once it is durably committed."""
        if verdict not in VERDICTS:
            raise FeedbackError(f"verdict must be one of {VERDICTS}, got {verdict!r}")
        if verdict == "edit":
            if not isinstance(edited, str) or not edited.strip():
                raise FeedbackError("an 'edit' needs the improved reply text (non-empty)")
        elif edited is not None:
            raise FeedbackError(f"edited text goes with verdict 'edit' only, not {verdict!r}")
        if not isinstance(reply, str):
            raise FeedbackError(f"reply must be text, got {reply!r:.200}")
        row = (str(conversation_id), json.dumps(check_turns(turns), ensure_ascii=False), reply, verdict, edited,
               str(model or ""), datetime.now(timezone.utc).isoformat(timespec="microseconds"))
        self._ensure()

        def insert(conn):
            conn.execute("BEGIN IMMEDIATE")
            try:
                cursor = conn.execute("INSERT INTO feedback (conversation_id, turns, reply, verdict, edited, model, "
                                      "created) VALUES (?, ?, ?, ?, ?, ?, ?)", row)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            return int(cursor.lastrowid)

        with self._lock:
            return self._retry(insert)

    # ----------------------------------------------------------------------------------------- reads

    def count(self, after_id: int = 0) -> int:
        """How many records have an id above after_id."""
        self._ensure()
        return self._retry(lambda conn: conn.execute("SELECT COUNT(*) FROM feedback WHERE id > ?",
                                                     (int(after_id),)).fetchone()[0])

    def max_id(self) -> int:
        """The highest id recorded (0 when empty): a watermark for incremental reads."""
        self._ensure()
        return self._retry(lambda conn: conn.execute("SELECT COALESCE(MAX(id), 0) FROM feedback").fetchone()[0])

    def records(self, after_id: int = 0, up_to_id: int | None = None) -> list[dict]:
        """Records with after_id < id <= up_to_id, in id order, turns parsed back into messages."""
        self._ensure()
        sql, args = f"SELECT {', '.join(COLUMNS)} FROM feedback WHERE id > ?", [int(after_id)]
        if up_to_id is not None:
            sql += " AND id <= ?"
            args.append(int(up_to_id))
        rows = self._retry(lambda conn: conn.execute(sql + " ORDER BY id", args).fetchall())
        out = []
        for values in rows:
            record = dict(zip(COLUMNS, values))
            record["turns"] = json.loads(record["turns"])
            out.append(record)
        return out


# ------------------------------------------------------------------------------------- training data

def _ordered(records: Iterable[dict]) -> list[dict]:
    out = []
    for i, r in enumerate(records):
        r = dict(r)
        r["turns"] = check_turns(r["turns"])
        if r.get("verdict") not in VERDICTS:
            raise FeedbackError(f"record {r.get('id', i)}: verdict must be one of {VERDICTS}, got {r.get('verdict')!r}")
        out.append((r.get("id", i), i, r))
    return [r for _, _, r in sorted(out, key=lambda t: (t[0], t[1]))]


def _key(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def _ratings(records: list[dict]) -> list[dict]:
    """Edits, plus up/down votes where a later vote on the same reply in the same conversation (a change of
    mind) replaces an earlier one; in id order."""
    last: dict[tuple, int] = {}
    for i, r in enumerate(records):
        if r["verdict"] != "edit":
            last[(str(r.get("conversation_id")), _key(r["turns"]), r["reply"])] = i
    return [r for i, r in enumerate(records)
            if r["verdict"] == "edit" or last[(str(r.get("conversation_id")), _key(r["turns"]), r["reply"])] == i]


def _good(record: dict) -> str | None:
    if record["verdict"] == "up":
        return record["reply"]
    if record["verdict"] == "edit":
        return record["edited"]
    return None


def sft_conversations(records: Iterable[dict]) -> list[dict]:
    """Liked or edited replies with the turns before them, as {"messages": [...turns, assistant reply]} (an
    edit's text replaces the reply); deduplicated, in order of first appearance by id."""
    out, seen = [], set()
    for r in _ratings(_ordered(records)):
        text = _good(r)
        if text is None or not text.strip():
            continue
        messages = r["turns"] + [{"role": "assistant", "content": text}]
        key = _key(messages)
        if key not in seen:
            seen.add(key)
            out.append({"messages": messages})
    return out


def preference_pairs(records: Iterable[dict]) -> list[dict]:
    """{"prompt": turns, "chosen": [assistant], "rejected": [assistant]} rows (TRL conversational preference
    format). Every edit gives (edited, original reply); every prompt (same turns) with both a liked-or-edited
    reply and a disliked one gives each good x bad combination. Deduplicated; chosen never equals rejected."""
    groups: dict[str, dict] = {}
    for r in _ratings(_ordered(records)):
        group = groups.setdefault(_key(r["turns"]), {"turns": r["turns"], "events": []})
        group["events"].append(r)
    out, seen = [], set()

    def add(turns, chosen, rejected):
        if not chosen.strip() or chosen == rejected:
            return
        key = _key([turns, chosen, rejected])
        if key not in seen:
            seen.add(key)
            out.append({"prompt": turns, "chosen": [{"role": "assistant", "content": chosen}],
                        "rejected": [{"role": "assistant", "content": rejected}]})

    for group in groups.values():  # dicts keep insertion order: groups by first id
        goods = [g for g in (_good(r) for r in group["events"]) if g is not None]
        bads = [r["reply"] for r in group["events"] if r["verdict"] == "down"]
        for r in group["events"]:
            if r["verdict"] == "edit":
                add(group["turns"], r["edited"], r["reply"])
        for good in goods:
            for bad in bads:
                add(group["turns"], good, bad)
    return out
