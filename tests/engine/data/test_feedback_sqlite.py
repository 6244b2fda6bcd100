"""The SQLite feedback store's own ways (engine/data/feedback/sqlite.py): its file in WAL mode with full sync, rows
written by others read and skipped, and every older layout migrated on open. What both backends do is in
test_feedback_contract.py."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing

from dragon_dagster.engine.data.feedback import sqlite as sqlite_store
from dragon_dagster.engine.data.feedback.records import SCHEMA_VERSION
from dragon_dagster.engine.data.feedback.sqlite import SQLiteFeedbackStore
from dragon_dagster.engine.data.feedback_rows import preference_pairs, sft_conversations, usable_records
from tests.engine.data.feedback_support import CRAFTED, TOOL_TURNS, turns


def test_the_file_is_wal_with_full_sync_and_the_current_layout(tmp_path, monkeypatch):
    """WAL and synchronous=FULL on every connection the store writes with (a write record() acknowledged survives
    a power cut, not only a killed process). SQLite's own default is FULL on this build, so a connection checked
    as the store opens it would say FULL whatever the store set: here connections start at NORMAL, the default of
    many builds and what WAL databases are often given, and only the store's own setting makes them FULL."""
    connect = sqlite3.connect

    def starting_at_normal(*args, **kwargs):
        conn = connect(*args, **kwargs)
        conn.execute("PRAGMA synchronous = NORMAL")
        return conn

    monkeypatch.setattr(sqlite_store.sqlite3, "connect", starting_at_normal)
    store = SQLiteFeedbackStore(tmp_path / "feedback" / "feedback.sqlite")
    assert store.count() == 0 and store.journal_mode() == "wal"
    conn = store._connect()  # what every read and write of the store runs on (_retry)
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    conn.close()
    with closing(starting_at_normal(tmp_path / "other.sqlite")) as conn:
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL: what the store's setting overrides
    monkeypatch.undo()
    with sqlite3.connect(store.path) as conn:
        columns = {row[1] for row in conn.execute("PRAGMA table_info(feedback)")}
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 6
        message_columns = {row[1] for row in conn.execute("PRAGMA table_info(messages)")}
    assert columns == {
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
        "record_key",
    }
    assert message_columns == {"id", "parent", "role", "content", "digest", "extra"}
    assert store.check() == store.where == str(store.path)


def test_bad_rows_in_a_real_store_are_skipped(tmp_path):
    """Rows the API refuses can still be in a file (first-layout data, another writer): reading them and
    building datasets from them skips and counts them."""
    store = SQLiteFeedbackStore(tmp_path / "f.sqlite")
    for r in CRAFTED[:3]:
        store.record(r["conversation_id"], r["turns"], r["reply"], r["verdict"], edited=r["edited"], model="m")
    with sqlite3.connect(store.path) as conn:
        for legacy, verdict, edited in (
            ("{oops", "up", None),
            ('[{"role": "assistant", "content": "a"}]', "up", None),
            ('[{"role": "user", "content": "q"}]', "edit", None),
        ):
            conn.execute(
                "INSERT INTO feedback (conversation_id, legacy_turns, reply, verdict, edited, created) "
                "VALUES ('bad', ?, 'r', ?, ?, '2026')",
                (legacy, verdict, edited),
            )
    rows = store.records()
    assert (
        len(rows) == 6 and rows[3]["turns"] == "{oops" and rows[4]["turns"] == [{"role": "assistant", "content": "a"}]
    )
    assert usable_records(rows)[1] == {"turns_not_json": 1, "no_user_turn": 1, "edit_without_text": 1}
    assert sft_conversations(rows) == sft_conversations(CRAFTED[:3])
    assert preference_pairs(rows) == preference_pairs(CRAFTED[:3])


# ---------------------------------------------------------------------------- schema and storage

OLD_SCHEMA = """
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


def test_first_layout_store_is_migrated_on_open(tmp_path):
    path = tmp_path / "old.sqlite"
    long = "x" * 5000
    history = [{"role": "user", "content": long}]
    old_rows = []
    for i in range(6):  # one conversation rated after every exchange: the old layout repeats the turns
        old_rows.append(("c", json.dumps(history), f"r{i}", "up", None))
        history = history + [{"role": "assistant", "content": f"r{i}"}, {"role": "user", "content": f"q{i}"}]
    old_rows += [
        ("bad", "{not json", "r", "up", None),
        ("bad", json.dumps([{"role": "assistant", "content": "no user"}]), "r", "up", None),
        ("bad", json.dumps({"not": "a list"}), "r", "down", None),
        ("e", json.dumps([{"role": "user", "content": "q"}]), "r", "edit", "better"),
    ]
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(OLD_SCHEMA)
    for row in old_rows:
        conn.execute(
            "INSERT INTO feedback (conversation_id, turns, reply, verdict, edited, model, created) "
            "VALUES (?, ?, ?, ?, ?, 'm', '2026-01-01')",
            row,
        )
    conn.execute("DELETE FROM feedback WHERE id > 9")  # ids above the rows kept must not be reused (sequence 10)
    conn.execute(
        "INSERT INTO feedback (conversation_id, turns, reply, verdict, edited, model, created) "
        "VALUES ('e', ?, 'r', 'edit', 'better', 'm', '2026-01-01')",
        (json.dumps(turns("q")),),
    )
    conn.commit()
    expected = [
        (rid, json.loads(t) if not t.startswith("{n") else t)
        for rid, t in conn.execute("SELECT id, turns FROM feedback ORDER BY id")
    ]
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 0
    conn.close()

    store = SQLiteFeedbackStore(path)
    rows = store.records()  # the first use migrates
    assert [(r["id"], r["turns"]) for r in rows] == expected
    assert [r["id"] for r in rows] == [1, 2, 3, 4, 5, 6, 7, 8, 9, 11]
    assert rows[5]["turns"][0]["content"] == long and rows[5]["reply"] == "r5" and rows[5]["model"] == "m"
    assert rows[-1]["edited"] == "better" and rows[-1]["verdict"] == "edit"
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert conn.execute("SELECT COUNT(*) FROM messages WHERE content = ?", (long,)).fetchone()[0] == 1
        assert conn.execute("SELECT COUNT(*) FROM feedback WHERE legacy_turns IS NOT NULL").fetchone()[0] == 2
        assert {r[1] for r in conn.execute("PRAGMA table_info(feedback)")} >= {"turns_id", "legacy_turns"}
    usable, skipped = usable_records(rows)
    assert skipped == {"turns_not_json": 1, "no_user_turn": 1, "turns_malformed": 1}
    assert len(sft_conversations(rows)) == 7  # six liked replies and the edit
    assert store.record("new", turns("q"), "r", "up") == 12  # the old sequence goes on
    assert SQLiteFeedbackStore(path).records()[:-1] == rows  # opening again does not migrate twice


def test_a_version_2_store_gets_the_extra_column_and_keeps_its_messages(tmp_path):
    path = tmp_path / "f.sqlite"
    SQLiteFeedbackStore(path).record("c", turns("q", "a", "q2"), "r", "up")
    with sqlite3.connect(path) as conn:  # what version 2 wrote: messages without the extra column
        conn.execute("ALTER TABLE messages DROP COLUMN extra")
        conn.execute("PRAGMA user_version = 2")
    store = SQLiteFeedbackStore(path)
    assert store.records()[0]["turns"] == turns("q", "a", "q2")
    store.record("c", turns("q", "a", "q2"), "r2", "down")  # the same turns: found again by their digest
    store.record("c", TOOL_TURNS, "It shipped.", "up")
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 3 + 4
    assert [r["turns"] for r in store.records()] == [turns("q", "a", "q2")] * 2 + [TOOL_TURNS]


def test_a_version_3_store_gets_the_trace_id_column_and_keeps_its_records(tmp_path):
    path = tmp_path / "f.sqlite"
    SQLiteFeedbackStore(path).record("c", turns("q"), "r", "up")
    with sqlite3.connect(path) as conn:  # what version 3 wrote: feedback without the trace_id column
        conn.execute("ALTER TABLE feedback DROP COLUMN trace_id")
        conn.execute("PRAGMA user_version = 3")
    store = SQLiteFeedbackStore(path)
    [old] = store.records()
    assert old["trace_id"] is None and old["reply"] == "r"
    new = store.record("c", turns("q"), "r2", "down", trace_id="tr-123")
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 6
    assert [(r["id"], r["trace_id"]) for r in store.records()] == [(old["id"], None), (new, "tr-123")]


def test_a_version_5_store_gains_the_ids_index_and_keeps_its_records(tmp_path):
    """A store the code before version 6 made (its layout exactly: no `feedback_ids`, user_version 5) opens, gains
    the index the sensor's count runs on, and reads and writes as before."""
    path = tmp_path / "f.sqlite"
    store = SQLiteFeedbackStore(path)
    first = [store.record(f"c{i}", turns("q", "a", f"q{i}"), f"r{i}", "up") for i in range(3)]
    with sqlite3.connect(path) as conn:  # what version 5 left
        conn.execute("DROP INDEX feedback_ids")
        conn.execute("PRAGMA user_version = 5")
    before = store.records()

    def indexes():
        with closing(sqlite3.connect(path)) as conn:
            return {row[1] for row in conn.execute("PRAGMA index_list(feedback)")}

    assert "feedback_ids" not in indexes()
    reopened = SQLiteFeedbackStore(path)
    assert reopened.count(after_id=first[0]) == 2  # the first use upgrades
    assert "feedback_ids" in indexes() and "feedback_record_key" in indexes()
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 6
    assert reopened.records() == before
    assert reopened.record("c9", turns("q"), "r", "up") == first[-1] + 1


def _traced(store: SQLiteFeedbackStore) -> list[str]:
    """The statements the store runs from now on (as SQLite expands them, with their values)."""
    seen: list[str] = []
    connect = store._connect

    def traced():
        conn = connect()
        conn.set_trace_callback(seen.append)
        return conn

    store._connect = traced
    return seen


def test_the_sensor_the_chat_and_a_page_read_search_indexes_and_never_scan_a_table(tmp_path):
    """What the retraining sensor asks on every tick (count after the last retraining, the newest id), what the
    chat's write of a rating asks (its key, its turns' prefix) and a page of records() each search an index, as
    SQLite plans the very statements the store ran: none scans `feedback` or `messages`, so none slows with the
    store's size. The count runs on the id index alone (a covering index, not the rows with their texts)."""
    path = tmp_path / "f.sqlite"
    store = SQLiteFeedbackStore(path)
    for i in range(6):
        store.record(f"c{i % 2}", turns("q", "a", f"q{i}"), f"r{i}", "up")
    seen = _traced(store)
    store.count(after_id=3)
    store.max_id()
    store.record("c0", turns("q", "a", "q9"), "r9", "down", key="k1", replace=True)
    list(store.pages(after_id=1, up_to_id=5, size=2))
    queries = [q for q in seen if q.lstrip().upper().startswith(("SELECT", "WITH"))]
    assert len(queries) >= 6
    with closing(sqlite3.connect(path)) as conn:
        plans = {q: [row[-1] for row in conn.execute(f"EXPLAIN QUERY PLAN {q}")] for q in queries}
    for query, plan in plans.items():
        scans = [step for step in plan if step.startswith("SCAN") and step.split()[1] in ("feedback", "messages")]
        assert not scans, f"{query} scans a table: {plan}"
    [count] = [plan for q, plan in plans.items() if q.startswith("SELECT COUNT(*) FROM feedback")]
    assert count == ["SEARCH feedback USING COVERING INDEX feedback_ids (id>?)"]
