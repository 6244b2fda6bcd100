"""The SQL both backends run on the same two tables (sqlite.py, postgres.py): a record's turns stored as a chain of
messages, a revised rating, and the reads (count, max_id, ratings, records and its pages) in the driver's
parameter mark. Every read is a range or a lookup of a primary key or a unique index (a page of records: its id
range, then its messages by id): none reads more as the store grows.

The turns are stored once: every message is a row of `messages` pointing at the message before it (a tree of
conversations, identical prefixes shared), and a feedback row names the last message before the reply
(`turns_id`). So rating the 20th reply of a conversation adds one small row, not the 20 exchanges before it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator

from ..feedback_turns import extras, with_extras
from .records import MAX_MESSAGE_CHARS, CheckedRecord, FeedbackRecord, RatingRecord, checked_record

PAGE = 1_000  # records per page of records() (keyset pagination): one page's rows and messages in memory at once
LOOKUP = 1_000  # message ids per lookup (SQLite takes at most 32,766 parameters a statement)
RATINGS_PAGE = 50_000  # ratings (four short columns) per page of ratings()

# the feedback table's columns as records() reads them (then each record's turns are assembled from its chain)
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


def revise(conn, record_id: int, record: CheckedRecord, mark: str = "?") -> None:
    """A rater's revised rating, in place: the stored record takes `record`'s verdict, edit, model and time."""
    conn.execute(
        f"UPDATE feedback SET verdict = {mark}, edited = {mark}, model = {mark}, created = {mark} WHERE id = {mark}",
        (*record.revision, int(record_id)),
    )


def assemble(rows: list[tuple], nodes: list[tuple]) -> list[FeedbackRecord]:
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


def chains(conn, ends: list[int | None], mark: str = "?") -> list[tuple]:
    """The stored messages (id, parent, role, content, extra) of the chains ending at the message ids `ends`: a
    level at a time, each message found by its primary key and its parent asked for next, so one page of records
    reads its messages and nothing else. (A recursive join of `messages` to the chain would be shorter to write,
    but PostgreSQL plans it as a hash join that scans the whole table at every level: 1.2 s for 1,000 records in a
    store of 100,000, growing with the store; benchmarks/feedback_scale.py.)"""
    found: dict[int, tuple] = {}
    wanted = {int(i) for i in ends if i}
    while wanted:
        batch = sorted(wanted)
        for start in range(0, len(batch), LOOKUP):
            ids = batch[start : start + LOOKUP]
            query = (
                f"SELECT id, parent, role, content, extra FROM messages WHERE id IN ({', '.join([mark] * len(ids))})"
            )
            found.update((row[0], tuple(row)) for row in conn.execute(query, ids).fetchall())
        wanted = {found[i][1] for i in batch if i in found and found[i][1] and found[i][1] not in found}
    return list(found.values())


class FeedbackTables:
    """What both backends share: record() (the same checks, then the backend's `_append` of one checked record),
    and the reads as the same SQL in the driver's parameter mark (MARK), each inside the backend's `_snapshot`
    (one consistent view) and its `_retry`. A backend gives `_ensure`, `_retry`, `_append` and `_snapshot`."""

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
        messages, checked = checked_record(
            self.max_message_chars, conversation_id, turns, reply, verdict, edited, model, trace_id
        )
        self._ensure()
        return self._append(messages, checked, key, replace)

    def count(self, after_id: int = 0) -> int:
        """How many records have an id above after_id."""
        self._ensure()
        query = f"SELECT COUNT(*) FROM feedback WHERE id > {self.MARK}"
        return int(self._retry(lambda conn: conn.execute(query, (int(after_id),)).fetchone()[0]))

    def max_id(self) -> int:
        """The highest id committed (0 when empty): a watermark for incremental reads."""
        self._ensure()
        return int(self._retry(lambda conn: conn.execute("SELECT COALESCE(MAX(id), 0) FROM feedback").fetchone()[0]))

    def verdict_counts(self, up_to_id: int) -> dict[str, tuple[int, int]]:
        """{model: (liked, rated)} of the records with id <= up_to_id: counted by the database (one GROUP BY
        pass), not read a rating at a time (every rating at a million records: 1.3-1.5 s a look;
        benchmarks/feedback_scale.py)."""
        self._ensure()
        query = (
            "SELECT model, SUM(CASE WHEN verdict = 'up' THEN 1 ELSE 0 END), COUNT(*) FROM feedback "
            f"WHERE id <= {self.MARK} GROUP BY model"
        )
        rows = self._retry(lambda conn: conn.execute(query, (int(up_to_id),)).fetchall())
        return {row[0] or "": (int(row[1]), int(row[2])) for row in rows}

    def first_ratings(self, model: str, after_id: int, limit: int) -> list[RatingRecord]:
        """The first `limit` ratings of one model after after_id (id, model, verdict, created), in id order: the
        primary key walked from after_id, so it reads the records since then, never the store."""
        self._ensure()
        query = (
            f"SELECT id, model, verdict, created FROM feedback WHERE id > {self.MARK} AND model = {self.MARK} "
            f"ORDER BY id LIMIT {self.MARK}"
        )
        rows = self._retry(lambda conn: conn.execute(query, (int(after_id), model, int(limit))).fetchall())
        return [{"id": int(r[0]), "model": r[1], "verdict": r[2], "created": r[3]} for r in rows]

    def ratings(self, after_id: int = 0) -> list[RatingRecord]:
        """Records after after_id without their turns (id, model, verdict, created), in id order, read without
        assembling any conversation, a page at a time (keyset: id > the page before's last id). The live gate counts
        with verdict_counts and first_ratings instead; this is the whole read they are measured against."""
        self._ensure()
        query = f"SELECT id, model, verdict, created FROM feedback WHERE id > {self.MARK} ORDER BY id LIMIT {self.MARK}"
        out: list[RatingRecord] = []
        while True:
            last = out[-1]["id"] if out else int(after_id)
            rows = self._retry(lambda conn, last=last: conn.execute(query, (last, RATINGS_PAGE)).fetchall())
            out.extend({"id": int(r[0]), "model": r[1], "verdict": r[2], "created": r[3]} for r in rows)
            if len(rows) < RATINGS_PAGE:
                return out

    def records(self, after_id: int = 0, up_to_id: int | None = None) -> list[FeedbackRecord]:
        """Records with after_id < id <= up_to_id, in id order, with their turns as messages. Turns that could
        not be converted from the first layout come back as stored (parsed when they are JSON, else the
        text), for `usable_records` to skip and count. Read a page at a time (pages())."""
        return [record for page in self.pages(after_id, up_to_id) for record in page]

    def pages(
        self, after_id: int = 0, up_to_id: int | None = None, size: int | None = None
    ) -> Iterator[list[FeedbackRecord]]:
        """records(after_id, up_to_id) as pages of at most `size` (default PAGE) records, in id order: keyset
        pagination (each page is the records after the last id of the one before, ORDER BY id LIMIT size, a range
        of the primary key), so no query reads more than one page of records and their messages, however many
        there are. Each page is one consistent view; records below a watermark do not change between pages (ids
        only grow), save a rater's revised verdict."""
        self._ensure()
        size = int(size or PAGE)
        mark = self.MARK
        bound = f" AND id <= {mark}" if up_to_id is not None else ""
        tail = [int(up_to_id)] if up_to_id is not None else []

        def read(conn, last: int):
            with self._snapshot(conn):  # a page's records and their messages as of one moment
                rows = conn.execute(
                    f"SELECT {', '.join(COLUMNS)} FROM feedback WHERE id > {mark}{bound} ORDER BY id LIMIT {mark}",
                    [last, *tail, int(size)],
                ).fetchall()
                if not rows:
                    return rows, []
                nodes = chains(conn, [r[COLUMNS.index("turns_id")] for r in rows], mark)
            return rows, nodes

        last = int(after_id)
        while True:
            rows, nodes = self._retry(lambda conn, last=last: read(conn, last))
            if rows:
                yield assemble(rows, nodes)
            if len(rows) < size:
                return
            last = int(rows[-1][0])

    # what each backend gives
    def _ensure(self) -> None:
        raise NotImplementedError

    def _retry(self, work):
        raise NotImplementedError

    def _append(self, messages: list[dict], record: CheckedRecord, key: str | None, replace: bool) -> int:
        raise NotImplementedError

    def _snapshot(self, conn):
        raise NotImplementedError
