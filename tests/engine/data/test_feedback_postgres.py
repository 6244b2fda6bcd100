"""The feedback store on a real PostgreSQL server (a throwaway cluster, tests/postgres.py): the same records,
refusals and record ranges as the SQLite store, writers in several processes, a killed writer, a restarted
server, and a wrong URL."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time

import psycopg
import pytest

from dragon_dagster.engine.data.feedback_postgres import PostgresFeedbackStore, StoreUnreachable
from dragon_dagster.engine.data.feedback_rows import preference_pairs, sft_conversations, usable_records
from dragon_dagster.engine.data.feedback_store import SCHEMA_VERSION, FeedbackError, FeedbackStore
from dragon_dagster.engine.text.uris import without_password
from dragon_dagster.resources import ArtifactStore
from tests.engine.data.test_feedback_store import CRAFTED, ROOT, TOOL_TURNS, turns
from tests.support import closed_port


@pytest.fixture()
def url(postgres):
    return postgres.create_database()


def same_records(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "created"} for r in rows]


def test_postgres_keeps_what_sqlite_keeps(url, postgres, tmp_path):
    """The same writes give the same records, ids, ranges, refusals and datasets in both stores."""
    pg = PostgresFeedbackStore(url, "support")
    lite = FeedbackStore(tmp_path / "f.sqlite")
    history = [{"role": "system", "content": "S"}, {"role": "user", "content": "y" * 30_000}]
    for store in (pg, lite):
        assert store.count() == 0 and store.max_id() == 0 and store.records() == []
        for r in CRAFTED:
            store.record(r["conversation_id"], r["turns"], r["reply"], r["verdict"], edited=r["edited"], model="m")
        store.record("tools", TOOL_TURNS, "It shipped.", "up", trace_id="tr-1")
        grown = history
        for i in range(5):  # a long conversation: earlier turns stored once
            store.record("long", grown, f"reply {i}", "up")
            grown = grown + [{"role": "assistant", "content": f"reply {i}"}, {"role": "user", "content": f"q{i}"}]
        for bad in ({"verdict": "meh"}, {"verdict": "edit"}, {"turns": []}, {"reply": "r" * 40_000}):
            with pytest.raises(FeedbackError) as caught:
                store.record(**{"conversation_id": "c", "turns": turns("q"), "reply": "r", "verdict": "up", **bad})
            store.refusals = [*getattr(store, "refusals", []), str(caught.value)]
    assert pg.refusals == lite.refusals
    assert same_records(pg.records()) == same_records(lite.records())
    assert pg.max_id() == lite.max_id() == len(CRAFTED) + 6 and pg.count(after_id=3) == lite.count(after_id=3)
    assert same_records(pg.records(after_id=2, up_to_id=5)) == same_records(lite.records(after_id=2, up_to_id=5))
    rows = pg.records()
    assert rows[len(CRAFTED)]["trace_id"] == "tr-1" and rows[len(CRAFTED)]["turns"] == TOOL_TURNS
    assert rows[-1]["turns"][1]["content"] == "y" * 30_000 and len(rows[-1]["turns"]) == 2 + 4 * 2
    assert sft_conversations(usable_records(rows)[0]) == sft_conversations(usable_records(lite.records())[0])
    assert preference_pairs(rows) == preference_pairs(lite.records())
    # the layout: one schema per pipeline, the schema version recorded, turns stored once
    assert postgres.sql("SELECT version FROM feedback_support.schema_version", url.rsplit("/", 1)[1]) == str(
        SCHEMA_VERSION
    )
    db = url.rsplit("/", 1)[1]
    assert int(postgres.sql("SELECT count(*) FROM feedback_support.messages WHERE content LIKE 'yyy%'", db)) == 1
    # another pipeline's store in the same database is separate; a second object on the same store sees it all
    other = PostgresFeedbackStore(url, "other")
    assert other.max_id() == 0 and other.record("c", turns("q"), "r", "up") == 1
    assert same_records(PostgresFeedbackStore(url, "support").records()) == same_records(rows)
    assert not hasattr(pg, "delete") and not hasattr(pg, "update")


def test_a_rating_revised_under_its_key_is_one_record_in_either_store(url, tmp_path):
    turns = [{"role": "user", "content": "My hub is down"}]
    for store in (FeedbackStore(tmp_path / "feedback.db"), PostgresFeedbackStore(url, "support")):
        first = store.record("c1", turns, "Restart it.", "up", model="models:/support/1", key="tr-1:ann", replace=True)
        other = store.record("c1", turns, "Restart it.", "up", model="models:/support/1", key="tr-1:bob", replace=True)
        again = store.record(
            "c1",
            turns,
            "Restart it.",
            "edit",
            "Unplug it for ten seconds.",
            "models:/support/1",
            key="tr-1:ann",
            replace=True,
        )
        kept = store.record("c1", turns, "Restart it.", "down", key="tr-1:bob")  # a retry without replace: kept
        assert again == first != other == kept and store.count() == 2, store
        by_id = {r["id"]: r for r in store.records()}
        assert (by_id[first]["verdict"], by_id[first]["edited"]) == ("edit", "Unplug it for ten seconds.")
        assert by_id[other]["verdict"] == "up"


def test_a_newer_schema_is_refused_by_name(url, postgres):
    PostgresFeedbackStore(url, "support").check()
    postgres.sql("UPDATE feedback_support.schema_version SET version = 99", url.rsplit("/", 1)[1])
    with pytest.raises(FeedbackError, match=f"schema version 99; this code reads up to {SCHEMA_VERSION}"):
        PostgresFeedbackStore(url, "support").max_id()


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


def _writer(url, worker, n, start):
    start.wait(30)
    store = PostgresFeedbackStore(url, "support")
    for i in range(n):
        store.record(f"p{worker}", turns("shared opening", "hello", f"q{worker}-{i}"), f"r{i}", "up", model="m")


def test_concurrent_writers_lose_nothing_and_a_watermark_reader_misses_nothing(url):
    """Ten processes and ten threads write at once while a reader moves a watermark as retraining does (read
    up to max_id, then after it): every record is stored once and read exactly once. Ids are committed in
    order, so no record ever appears below a watermark already passed."""
    store = PostgresFeedbackStore(url, "support")
    store.check()
    ctx = multiprocessing.get_context("fork")
    start = ctx.Event()
    procs = [ctx.Process(target=_writer, args=(url, w, 6, start)) for w in range(10)]
    ids, errors, read, stop = [], [], [], threading.Event()

    def thread_writer(t):
        start.wait(30)
        try:
            for i in range(3):
                ids.append(store.record(f"t{t}", turns(f"thread {t} {i}"), "r", "down"))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def reader():
        reader_store = PostgresFeedbackStore(url, "support")
        watermark = 0
        while True:
            done = stop.is_set()
            up_to = reader_store.max_id()
            read.extend(r["id"] for r in reader_store.records(after_id=watermark, up_to_id=up_to))
            watermark = up_to
            if done:
                return
            time.sleep(0.01)

    threads = [threading.Thread(target=thread_writer, args=(t,)) for t in range(10)]
    watcher = threading.Thread(target=reader)
    for p in procs:
        p.start()
    watcher.start()
    for t in threads:
        t.start()
    start.set()
    for p in procs:
        p.join(120)
    for t in threads:
        t.join(120)
    stop.set()
    watcher.join(60)
    assert [p.exitcode for p in procs] == [0] * 10 and not errors
    rows = store.records()
    assert store.count() == 90 == len(rows) and [r["id"] for r in rows] == list(range(1, 91))
    assert sorted(read) == list(range(1, 91))  # every record read once: none committed behind the watermark
    assert set(ids) <= {r["id"] for r in rows} and len(ids) == 30
    assert sorted(r["turns"][-1]["content"] for r in rows if r["conversation_id"].startswith("p")) == sorted(
        f"q{w}-{i}" for w in range(10) for i in range(6)
    )


CHILD = """
import sys
from dragon_dagster.engine.data.feedback_postgres import PostgresFeedbackStore
store = PostgresFeedbackStore(sys.argv[1], "support")
for i in range(100000):
    fid = store.record("kill", [{"role": "user", "content": f"q{i}"}], "r" * 20000, "up")
    print(fid, flush=True)
"""


def _spawn_writer(url: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", CHILD, url], stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)


def _acknowledged(proc: subprocess.Popen, n: int, timeout: float = 60) -> list[int]:
    printed, deadline = [], time.monotonic() + timeout
    while len(printed) < n and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        printed.append(int(line))
    return printed


def test_a_writer_killed_mid_write_leaves_no_half_record(url):
    proc = _spawn_writer(url)
    try:
        printed = _acknowledged(proc, 25)
        proc.send_signal(signal.SIGKILL)  # mid-stream: the child is busy writing the next record
        rest = proc.stdout.read()
    finally:
        proc.kill()
        proc.wait()
    printed += [int(x) for x in rest.split()]
    assert proc.returncode == -signal.SIGKILL and len(printed) >= 25
    store = PostgresFeedbackStore(url, "support")
    rows = store.records()
    assert set(printed) <= {r["id"] for r in rows}
    assert all(r["turns"] and r["reply"] == "r" * 20000 for r in rows)  # each stored record is whole
    assert [r["id"] for r in rows] == list(range(1, len(rows) + 1))
    assert store.record("after", turns("q"), "r", "up") > max(printed)  # still writable


def test_writers_ride_out_a_server_restart_and_give_up_clearly(url, postgres):
    """A server restarted under a writer: its writes wait and go on, every acknowledged record is stored once. A
    server that stays down longer than the store's timeout is one clear error naming the setting."""
    proc = _spawn_writer(url)
    try:
        before = _acknowledged(proc, 10)
        postgres.restart(down_s=2.0)
        after = _acknowledged(proc, 10)
        proc.send_signal(signal.SIGKILL)
        rest = proc.stdout.read()
    finally:
        proc.kill()
        proc.wait()
    acknowledged = before + after + [int(x) for x in rest.split()]
    assert len(before) == 10 and len(after) == 10, "the writer did not go on after the restart"
    rows = PostgresFeedbackStore(url, "support").records()
    assert set(acknowledged) <= {r["id"] for r in rows}
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
    assert isinstance(ArtifactStore().feedback_store("support"), FeedbackStore)  # unset: SQLite, as before


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
