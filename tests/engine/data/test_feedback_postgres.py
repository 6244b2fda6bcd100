"""The PostgreSQL feedback store's own ways (engine/data/feedback/postgres.py) on a real server (a throwaway
cluster, tests/postgres.py): ids without gaps after a rollback or a crash, writers riding out a restarted server,
and a wrong URL as one clear error. What both backends do is in test_feedback_contract.py."""

from __future__ import annotations

import re
import signal
import time

import psycopg
import pytest

from dragon_dagster.engine.data.feedback.postgres import PostgresFeedbackStore, StoreUnreachable
from dragon_dagster.engine.data.feedback.records import SCHEMA_VERSION
from dragon_dagster.engine.data.feedback.sqlite import SQLiteFeedbackStore
from dragon_dagster.engine.text.uris import without_password
from dragon_dagster.resources import ArtifactStore
from tests.engine.data.feedback_support import acknowledged, spawn_writer, turns
from tests.support import closed_port


@pytest.fixture()
def url(postgres):
    return postgres.create_database()


def test_a_write_rolled_back_or_a_server_crash_leaves_no_gap_in_the_ids(url, postgres):
    """Ids are 1..max, as in SQLite: a write that rolls back (here a trigger refuses it after its row got an id;
    a chat server killed mid-write is the same) and a server crash (a sequence jumps by up to 32 after one) leave
    no hole, so the highest id is how many records there are."""
    store = PostgresFeedbackStore(url, "support")
    assert store.record("c", turns("q"), "first", "up") == 1
    db = url.rsplit("/", 1)[1]
    postgres.sql(
        "CREATE FUNCTION feedback_support.refuse() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN IF NEW.reply = 'boom' THEN RAISE EXCEPTION 'refused'; END IF; RETURN NEW; END $$",
        db,
    )
    postgres.sql(
        "CREATE TRIGGER refuse AFTER INSERT ON feedback_support.feedback FOR EACH ROW "
        "EXECUTE FUNCTION feedback_support.refuse()",
        db,
    )
    with pytest.raises(psycopg.Error, match="refused"):
        store.record("c", turns("q"), "boom", "up")
    assert store.record("c", turns("q"), "second", "up") == 2
    postgres.restart(mode="immediate")  # a crash: no shutdown checkpoint, recovery from the WAL
    assert store.record("c", turns("q"), "third", "up") == 3
    assert [(r["id"], r["reply"]) for r in store.records()] == [(1, "first"), (2, "second"), (3, "third")]


def test_writers_ride_out_a_server_restart_and_give_up_clearly(url, postgres):
    """A server restarted under a writer: its writes wait and go on, every acknowledged record is stored once. A
    server that stays down longer than the store's timeout is one clear error naming the setting."""
    proc = spawn_writer(PostgresFeedbackStore(url, "support"))
    try:
        before = acknowledged(proc, 10)
        postgres.restart(down_s=2.0)
        after = acknowledged(proc, 10)
        proc.send_signal(signal.SIGKILL)
        rest = proc.stdout.read()
    finally:
        proc.kill()
        proc.wait()
    all_acknowledged = before + after + [int(x) for x in rest.split()]
    assert len(before) == 10 and len(after) == 10, "the writer did not go on after the restart"
    rows = PostgresFeedbackStore(url, "support").records()
    assert set(all_acknowledged) <= {r["id"] for r in rows}
    assert len(rows) == len({r["id"] for r in rows}) and [r["id"] for r in rows] == list(range(1, len(rows) + 1))

    store = PostgresFeedbackStore(url, "support", timeout=2.0, setting="ArtifactStore.feedback_url")
    store.check()
    postgres.stop()
    try:
        began = time.monotonic()
        with pytest.raises(StoreUnreachable) as caught:
            store.record("down", turns("q"), "r", "up")
        assert 2.0 <= time.monotonic() - began < 30
    finally:
        postgres.start()
    message = str(caught.value)
    assert "ArtifactStore.feedback_url" in message and postgres.password not in message
    assert message.startswith(f"the feedback store (schema feedback_support) on 127.0.0.1:{postgres.port} (")
    assert without_password(url) in message and "***" in message and "Fix: start PostgreSQL" in message
    assert store.record("up again", turns("q"), "r", "up") == len(rows) + 1


def test_a_wrong_password_or_host_is_one_clear_error_without_the_password(url, postgres, monkeypatch):
    db = url.rsplit("/", 1)[1]
    wrong = postgres.url(db, password="not-the-password-42")
    unreachable = f"postgresql://dragon:secret-9f3@127.0.0.1:{closed_port()}/{db}"
    for given, via_env, expected in (
        (wrong, False, "password authentication failed"),
        (unreachable, True, "Connection refused"),
    ):
        if via_env:
            monkeypatch.setenv("DRAGON_FEEDBACK_URL", given)
            resource, setting = ArtifactStore(), "$DRAGON_FEEDBACK_URL"
        else:
            resource, setting = ArtifactStore(feedback_url=given), "ArtifactStore.feedback_url"
        began = time.monotonic()
        with pytest.raises(StoreUnreachable) as caught:
            resource.feedback_store("support").check()
        assert time.monotonic() - began < 10  # refused at once, not after retrying for a minute
        message = str(caught.value)
        assert setting in message and "127.0.0.1" in message and expected in message, message
        assert "not-the-password-42" not in message and "secret-9f3" not in message and "\n" not in message
        assert repr(resource.feedback_store("support")).count("***") == 1
    with pytest.raises(ValueError, match=r"must be a postgresql://user@host:port/database URL"):
        ArtifactStore(feedback_url="mysql://x@y/z").feedback_store("support")
    monkeypatch.setenv("DRAGON_FEEDBACK_URL", url)
    assert isinstance(ArtifactStore().feedback_store("support"), PostgresFeedbackStore)
    monkeypatch.delenv("DRAGON_FEEDBACK_URL")
    assert isinstance(ArtifactStore().feedback_store("support"), SQLiteFeedbackStore)  # unset: SQLite, as before


def test_a_chat_with_a_wrong_store_url_stops_before_it_starts(url, postgres, monkeypatch, tmp_path):
    """`dragon chat` and `dragon chat-ui` reach the store first: a wrong password is one line naming the setting."""
    from click.testing import CliRunner

    from dragon_dagster.cli import main

    monkeypatch.setenv("DRAGON_RUNS_DIR", str(tmp_path))
    monkeypatch.setenv("DRAGON_FEEDBACK_URL", postgres.url(url.rsplit("/", 1)[1], password="wrong-pw-77"))
    for command in ("chat", "chat-ui"):
        out = CliRunner().invoke(
            main, [command, "--pipeline", "tiny", "--model", "http://127.0.0.1:9/v1"], input="/quit\n"
        )
        assert out.exit_code == 1, out.output
        assert "$DRAGON_FEEDBACK_URL" in out.output and "password authentication failed" in out.output
        assert "wrong-pw-77" not in out.output and "Traceback" not in out.output


def test_a_version_5_store_opens_at_the_current_version_with_its_records(url):
    """A store the code before version 6 made opens with its records and is marked with the current version (the
    primary key already serves the reads by id range here: nothing else to build)."""
    store = PostgresFeedbackStore(url, "support")
    ids = [store.record(f"c{i}", turns("q", "a", f"q{i}"), f"r{i}", "up") for i in range(3)]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE feedback_support.schema_version SET version = 5")
    reopened = PostgresFeedbackStore(url, "support")
    assert reopened.count(after_id=ids[0]) == 2 and [r["id"] for r in reopened.records()] == ids
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute("SELECT version FROM feedback_support.schema_version").fetchall() == [(SCHEMA_VERSION,)]
    assert SCHEMA_VERSION == 6


def test_the_sensor_the_chat_and_a_page_read_use_an_index_not_a_sequential_scan(url):
    """The statements the store runs for the retraining sensor's tick (count after the last retraining, the newest
    id), a chat's write of a rating and a page of records(), as PostgreSQL plans them on a store of 20,000
    records (bulk-inserted, then analyzed, so the planner prices them as a grown store): each reads `feedback`
    and `messages` through an index condition (a primary key or unique range or lookup), never a scan of the
    whole table or index, so none slows with the store's size. (A page's messages read by a recursive join were
    planned as a hash join scanning all of `messages` at every level.)"""
    seen: list[tuple] = []

    class Traced(psycopg.Connection):
        def execute(self, query, params=None, **kwargs):
            if isinstance(query, str) and query.lstrip().upper().startswith(("SELECT", "WITH")):
                seen.append((query, params))
            return super().execute(query, params, **kwargs)

    store = PostgresFeedbackStore(url, "support")
    store.check()
    with _search_path(psycopg.connect(url, autocommit=True)) as conn:  # conversations of four messages
        conn.execute(
            "INSERT INTO messages (id, parent, role, content, digest) SELECT g, CASE WHEN g % 4 = 1 THEN 0 ELSE "
            "g - 1 END, CASE WHEN g % 2 = 1 THEN 'user' ELSE 'assistant' END, 'text ' || g, md5(g::text) "
            "FROM generate_series(1, 40000) g"
        )
        conn.execute("SELECT setval(pg_get_serial_sequence('messages', 'id'), 40000)")
        conn.execute(
            "INSERT INTO feedback (id, conversation_id, turns_id, reply, verdict, model, created) SELECT g, "
            "'c' || (g / 2), 2 * g - 1, 'reply ' || g, 'up', 'm', '2026-01-01' FROM generate_series(1, 20000) g"
        )
        conn.execute("VACUUM ANALYZE messages")
        conn.execute("VACUUM ANALYZE feedback")
    store._connect = lambda: _search_path(Traced.connect(url, autocommit=True))
    store._drop_connection()
    store.count(after_id=19_000)
    store.max_id()
    store.record("c0", turns("q", "a", "q9"), "r9", "down", key="k1", replace=True)
    [page] = list(store.pages(after_id=18_000, up_to_id=19_000, size=1000))
    assert len(page) == 1000 and page[0]["turns"] == turns("text 36001")
    assert page[1]["turns"] == turns("text 36001", "text 36002", "text 36003")
    queries = [(q, p) for q, p in seen if "pg_advisory" not in q]
    assert len(queries) >= 6
    with _search_path(psycopg.connect(url, autocommit=True)) as conn:
        for query, params in queries:
            plan = [row[0] for row in conn.execute(f"EXPLAIN {query}", params).fetchall()]
            text = "\n".join(plan)
            assert not re.search(r"Seq Scan on (feedback|messages)\b", text), f"{query}\n{text}"
            for i, line in enumerate(plan):  # an index scan with no condition would read the whole index
                if re.search(r"Index (Only )?Scan( Backward)? using \w+ on (feedback|messages)\b", line):
                    assert any("Index Cond" in x for x in plan[i + 1 : i + 3]), f"{query}\n{text}"


def _search_path(conn):
    conn.execute("SET search_path TO feedback_support")
    return conn
