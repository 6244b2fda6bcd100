"""The feedback store's contract (engine/data/feedback/store.py), run against both backends: a SQLite file and a
real PostgreSQL server (a throwaway cluster, tests/postgres.py). The same writes give the same records, ids and
ranges, the same refusals in the same words, writers in several processes lose nothing, and a killed writer
leaves no half record. What only one backend does (SQLite's migrations, PostgreSQL's restarts and logins) is in
test_feedback_sqlite.py and test_feedback_postgres.py."""

from __future__ import annotations

import json
import multiprocessing
import re
import signal
import sqlite3
import threading
import time
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

from dragon_dagster.engine.data.conversations import conversation_row
from dragon_dagster.engine.data.feedback import sql
from dragon_dagster.engine.data.feedback.postgres import PostgresFeedbackStore
from dragon_dagster.engine.data.feedback.records import MAX_MESSAGE_CHARS, SCHEMA_VERSION
from dragon_dagster.engine.data.feedback.sqlite import SQLiteFeedbackStore
from dragon_dagster.engine.data.feedback.store import FeedbackStore
from dragon_dagster.engine.data.feedback_rows import check_record, preference_pairs, sft_conversations, usable_records
from dragon_dagster.engine.data.feedback_turns import FeedbackError
from tests.engine.data.feedback_support import CALL, CRAFTED, TOOL_TURNS, acknowledged, record, spawn_writer, turns


@dataclass
class Backend:
    """One backend's store for a test: `open()` gives a new store object on the same records (keyword arguments:
    the store's own, max_message_chars, timeout), `scalar(sql)` the one value of a query on its tables, and
    `set_version(n)` writes the layout version where that backend keeps it."""

    name: str
    open: Callable[..., FeedbackStore]
    scalar: Callable[[str], Any]
    set_version: Callable[[int], None]


def sqlite_backend(tmp_path) -> Backend:
    path = tmp_path / "feedback" / "feedback.sqlite"

    def scalar(query: str):
        with closing(sqlite3.connect(path)) as conn:
            return conn.execute(query).fetchone()[0]

    def set_version(version: int) -> None:
        with closing(sqlite3.connect(path)) as conn:
            conn.execute(f"PRAGMA user_version = {int(version)}")

    return Backend("sqlite", lambda **kw: SQLiteFeedbackStore(path, **kw), scalar, set_version)


def postgres_backend(url: str) -> Backend:
    def scalar(query: str):
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SET search_path TO feedback_support")
            return conn.execute(query).fetchone()[0]

    def set_version(version: int) -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("UPDATE feedback_support.schema_version SET version = %s", (version,))

    return Backend("postgresql", lambda **kw: PostgresFeedbackStore(url, "support", **kw), scalar, set_version)


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request, tmp_path) -> Backend:
    if request.param == "sqlite":
        return sqlite_backend(tmp_path)
    return postgres_backend(request.getfixturevalue("postgres").create_database())


def same_records(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "created"} for r in rows]


def test_records_round_trip_with_their_ids_and_ranges(backend):
    store = backend.open()
    assert store.count() == 0 and store.max_id() == 0 and store.records() == []
    history = [{"role": "system", "content": "Be brief."}] + turns("hi", "hello", "what's 2+2? ü")
    a = store.record("c1", history, "5", "down", model="runs/artifacts/x/merged_model/1")
    b = store.record("c1", history, "5", "edit", edited="4", model="runs/artifacts/x/merged_model/1")
    c = store.record("c2", turns("yo"), "hey", "up")
    assert a < b < c and store.count() == 3 and store.count(after_id=a) == 2 and store.max_id() == c
    rows = store.records()
    assert [r["id"] for r in rows] == [a, b, c]
    assert rows[0]["turns"] == history and rows[0]["reply"] == "5" and rows[0]["verdict"] == "down"
    assert rows[0]["edited"] is None and rows[0]["model"] == "runs/artifacts/x/merged_model/1"
    assert rows[1]["edited"] == "4" and rows[1]["conversation_id"] == "c1" and rows[2]["model"] == ""
    assert rows[0]["created"] <= rows[2]["created"] and rows[0]["created"].startswith("20")
    assert [r["id"] for r in store.records(after_id=a, up_to_id=b)] == [b]
    assert store.ratings(after_id=a) == [{k: r[k] for k in ("id", "model", "verdict", "created")} for r in rows[1:]]
    assert not hasattr(store, "delete") and not hasattr(store, "update")
    # another store object on the same records sees the same data
    assert backend.open().records() == rows


def test_the_live_gate_s_counts_and_first_ratings_come_from_the_database_as_from_every_rating(backend):
    """verdict_counts (a GROUP BY) and first_ratings (a seek from an id) give the live gate what reading every
    rating gave it: each version's (liked, rated) up to a record, and a version's first ratings after one."""
    from dragon_dagster.engine.evaluate.live_rates import Ratings, live_decision, live_rates

    store = backend.open()
    plan = [("1", "up"), ("2", "down"), ("1", "edit"), ("2", "up"), ("1", "up"), ("2", "up"), ("1", "down")]
    ids = [store.record(f"c{i}", turns("hi"), "hello", v, edited="better" if v == "edit" else None,
                        model=f"models:/support/{m}") for i, (m, v) in enumerate(plan)]  # fmt: skip
    store.record("x", turns("hi"), "hello", "up", model="models:/other/1")
    assert store.verdict_counts(ids[-1]) == {"models:/support/1": (2, 4), "models:/support/2": (2, 3)}
    assert store.verdict_counts(ids[2]) == {"models:/support/1": (1, 2), "models:/support/2": (0, 1)}
    assert [r["id"] for r in store.first_ratings("models:/support/2", ids[1], 2)] == [ids[3], ids[5]]
    assert store.first_ratings("models:/support/2", ids[1], 2)[0]["verdict"] == "up"
    every = store.ratings()
    for newest in (ids[2], ids[-1]):
        counted = Ratings(store, "support", newest)
        assert counted.counted and counted.rates() == live_rates([r for r in every if r["id"] <= newest], "support")
    first = Ratings(store, "support", ids[-1]).first(["1", "2"], ids[0], 2)
    assert [r["id"] for r in first] == [ids[1], ids[2], ids[3], ids[4]]
    # a model written with stray spaces is the same version; a look as of an earlier record ignores later ones
    late = store.record("y", turns("hi"), "hello", "down", model=" models:/support/2 ")
    every = store.ratings()

    class TracesOnly:  # a source with the reading interface alone (MLflow traces' feedback): read whole
        def records(self, after_id=0, up_to_id=None):
            return [r for r in every if after_id < r["id"] <= (up_to_id or late)]

    for newest in (ids[4], late):
        whole = [r for r in every if r["id"] <= newest]
        for source in (store, TracesOnly()):
            ratings = Ratings(source, "support", newest)
            assert ratings.counted == (source is store) and ratings.rates() == live_rates(whole, "support")
            for after, need in ((ids[0], 2), (ids[1], 3), (0, 1)):
                decided = live_decision(ratings.first(["2", "1"], after, need), "support", "2", "1", need, 0.05, after)
                assert decided == live_decision(whole, "support", "2", "1", need, 0.05, after_id=after)
    assert Ratings(store, "support", late).rates()["2"] == (2, 4)


# Each refused record, and the words of its refusal: what a chat shows the person whose rating it was
REFUSED = [
    ({"verdict": "meh"}, "verdict must be one of ('up', 'down', 'edit'), got 'meh'"),
    ({"verdict": "edit"}, "an 'edit' needs the improved reply text (non-empty)"),
    ({"verdict": "edit", "edited": "  "}, "an 'edit' needs the improved reply text (non-empty)"),
    ({"verdict": "up", "edited": "x"}, "edited text goes with verdict 'edit' only, not 'up'"),
    ({"verdict": "up", "turns": []}, "turns must be a non-empty list of chat messages, got []"),
    ({"verdict": "up", "turns": [{"role": "assistant", "content": "only"}]}, "turns must include a user turn"),
    ({"verdict": "up", "turns": [{"role": "robot", "content": "x"}]}, "a chat message must be a dict with a role in"),
    ({"verdict": "up", "reply": None}, "reply must be text, got None"),
]


def test_invalid_feedback_is_refused_naming_the_problem(backend):
    """Each bad record is refused with a FeedbackError (a ValueError, which callers catch) saying what is wrong
    with it, and nothing is stored."""
    store = backend.open()
    for kwargs, words in REFUSED:
        kwargs = {"conversation_id": "c", "turns": turns("q"), "reply": "r", **kwargs}
        with pytest.raises(FeedbackError, match=re.escape(words)) as caught:
            store.record(**kwargs)
        assert isinstance(caught.value, ValueError), caught.value
    assert store.count() == 0 and store.max_id() == 0
    assert store.record("c", turns("q"), "r", "up") == 1  # the same call with good values is stored


def test_over_long_messages_are_refused_with_the_limit(backend):
    store = backend.open()
    limit = MAX_MESSAGE_CHARS
    assert limit == 32_000
    ok = store.record("c", turns("q" * limit), "r" * limit, "edit", edited="e" * limit)
    for kwargs, what in (
        ({"turns": turns("q" * (limit + 1))}, "turn 0 (user)"),
        ({"reply": "r" * 40_000}, "the reply"),
        ({"verdict": "edit", "edited": "e" * 32_001}, "the edited reply"),
    ):
        with pytest.raises(FeedbackError) as caught:
            store.record(**{"conversation_id": "c", "turns": turns("q"), "reply": "r", "verdict": "up", **kwargs})
        message = str(caught.value)
        assert message.startswith(what) and "32,000 characters per message" in message
        assert f"{len(kwargs.get('edited') or kwargs.get('reply') or kwargs['turns'][0]['content']):,}" in message
    assert store.max_id() == ok == 1
    assert backend.open(max_message_chars=None).record("c", turns("q" * 100_000), "r", "up")


def test_a_rating_revised_under_its_key_is_one_record(backend):
    store = backend.open()
    turns = [{"role": "user", "content": "My hub is down"}]
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


def test_tool_turns_are_stored_and_come_back_in_the_datasets(backend):
    """A chat's tool-call turn and tool turn survive the store and stay in the prompt of every row made from the
    record; a tool turn after no call is refused (it would not render)."""
    store = backend.open()
    store.record("c", TOOL_TURNS, "It shipped.", "up")
    store.record("c", TOOL_TURNS, "No idea.", "down")
    # the same text without the call is another message, not the stored one
    plain = [*TOOL_TURNS[:2], {"role": "assistant", "content": ""}, {"role": "user", "content": "?"}]
    store.record("d", plain, "r", "up")
    rows = store.records()
    assert rows[0]["turns"] == TOOL_TURNS and rows[1]["turns"] == TOOL_TURNS
    assert rows[2]["turns"] == plain
    [sft, _] = sft_conversations(rows)
    assert sft["messages"] == [*TOOL_TURNS, {"role": "assistant", "content": "It shipped."}]
    assert conversation_row(sft["messages"])["prompt"] == TOOL_TURNS  # the calls are context for the answer
    [pair] = preference_pairs(rows)
    assert pair["prompt"] == TOOL_TURNS and pair["chosen"][0]["content"] == "It shipped."
    assert json.loads(backend.scalar("SELECT extra FROM messages WHERE role = 'tool'")) == {"name": "order_status"}
    for bad in (
        [{"role": "user", "content": "q"}, {"role": "tool", "content": "x"}],  # a result nothing asked for
        [{"role": "user", "content": "q", "tool_calls": [CALL]}],  # only an assistant calls
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [{"nope": 1}]}],
    ):
        with pytest.raises(FeedbackError):
            store.record("e", bad, "r", "up")
    assert check_record(record(9, "e", bad, "r", "up")) == "turns_malformed"


def test_turns_are_stored_once_per_conversation(backend):
    store = backend.open()
    history = [{"role": "system", "content": "S"}, {"role": "user", "content": "y" * 30_000}]
    for i in range(20):
        store.record("c", history, f"reply {i}", "up")
        history = history + [{"role": "assistant", "content": f"reply {i}"}, {"role": "user", "content": f"q{i}"}]
    store.record("other", history[:2], "another reply", "down")  # the same opening, another conversation
    assert backend.scalar("SELECT COUNT(*) FROM messages") == 2 + 19 * 2
    assert backend.scalar("SELECT SUM(LENGTH(content)) FROM messages") < 31_000
    rows = store.records()
    assert len(rows[-2]["turns"]) == 2 + 19 * 2 and rows[-2]["turns"][1]["content"] == "y" * 30_000
    assert rows[-1]["turns"] == history[:2] and rows[-1]["turns_id"] == rows[0]["turns_id"]
    assert [r["id"] for r in store.records(after_id=5, up_to_id=7)] == [6, 7]
    assert store.records(after_id=5, up_to_id=7)[1]["turns"] == rows[6]["turns"]


def test_records_are_read_in_pages_each_once_and_in_order(backend, monkeypatch):
    """Keyset pagination (id > the last id of the page before, ORDER BY id LIMIT size): across page boundaries,
    with a range's bounds inside a page or on its edge, every record comes once, in id order, with turns whose
    shared prefix was read by an earlier page; records() and ratings() read that way give what one read gives."""
    store = backend.open()
    history, ids = turns("opening"), []
    for i in range(7):  # one conversation growing (each record's turns extend the one before) and another
        ids.append(store.record(f"c{i % 2}", history, f"r{i}", "up" if i % 3 else "down"))
        history = history + [{"role": "assistant", "content": f"r{i}"}, {"role": "user", "content": f"q{i}"}]
    whole = store.records()
    assert [r["id"] for r in whole] == ids and len(whole[-1]["turns"]) == 13
    pages = list(store.pages(size=3))
    assert [[r["id"] for r in page] for page in pages] == [ids[0:3], ids[3:6], ids[6:]]
    assert [r for page in pages for r in page] == whole
    in_range = list(store.pages(after_id=ids[1], up_to_id=ids[5], size=2))  # the last page ends on the bound
    assert [[r["id"] for r in page] for page in in_range] == [ids[2:4], ids[4:6]]
    assert [[r["id"] for r in page] for page in store.pages(after_id=ids[0], up_to_id=ids[4], size=3)] == [
        ids[1:4],
        ids[4:5],
    ]
    assert list(store.pages(after_id=ids[-1])) == []
    monkeypatch.setattr(sql, "PAGE", 2)
    monkeypatch.setattr(sql, "RATINGS_PAGE", 2)
    assert store.records() == whole and store.records(after_id=ids[2], up_to_id=ids[5]) == whole[3:6]
    assert [r["id"] for r in store.ratings(after_id=ids[0])] == ids[1:]
    assert [r["verdict"] for r in store.ratings()] == [r["verdict"] for r in whole]


def test_store_records_feed_the_datasets(backend):
    store = backend.open()
    for r in CRAFTED:
        store.record(r["conversation_id"], r["turns"], r["reply"], r["verdict"], edited=r["edited"], model="m")
    records = store.records()
    assert sft_conversations(records) == sft_conversations(CRAFTED)
    assert preference_pairs(records) == preference_pairs(CRAFTED)
    watermark = records[2]["id"]
    assert len(preference_pairs(store.records(up_to_id=watermark))) == 2
    assert preference_pairs(store.records(after_id=watermark)) == []


def test_a_newer_schema_is_refused_by_name(backend):
    backend.open().check()
    backend.set_version(99)
    with pytest.raises(FeedbackError, match=f"schema version 99; this code reads up to {SCHEMA_VERSION}"):
        backend.open().max_id()


def _writer(open_store, worker, n, start):
    start.wait(30)
    store = open_store()
    for i in range(n):
        store.record(f"p{worker}", turns("shared opening", "hello", f"q{worker}-{i}"), f"r{i}", "up", model="m")


def test_concurrent_writers_lose_nothing_and_a_watermark_reader_misses_nothing(backend):
    """Ten processes and ten threads write at once, into a store nobody created beforehand, while a reader
    moves a watermark as retraining does (read up to max_id, then after it): every record is stored once and read
    exactly once. Ids are committed in order, so no record ever appears below a watermark already passed."""
    store = backend.open()
    ctx = multiprocessing.get_context("fork")
    start = ctx.Event()
    procs = [ctx.Process(target=_writer, args=(backend.open, w, 6, start)) for w in range(10)]
    ids, errors, read, stop = [], [], [], threading.Event()

    def thread_writer(t):
        start.wait(30)
        try:
            for i in range(3):
                ids.append(store.record(f"t{t}", turns(f"thread {t} {i}"), "r", "down"))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def reader():
        reader_store = backend.open()
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


def test_a_writer_killed_mid_write_loses_no_acknowledged_record_and_leaves_none_half(backend):
    proc = spawn_writer(backend.open())
    try:
        printed = acknowledged(proc, 25)
        proc.send_signal(signal.SIGKILL)  # mid-stream: the child is busy writing the next record
        rest = proc.stdout.read()
    finally:
        proc.kill()
        proc.wait()
    printed += [int(x) for x in rest.split()]
    assert proc.returncode == -signal.SIGKILL and len(printed) >= 25
    store = backend.open()
    rows = store.records()
    assert set(printed) <= {r["id"] for r in rows}
    assert all(r["turns"] and r["reply"] == "r" * 20000 for r in rows)  # each stored record is whole
    assert [r["id"] for r in rows] == list(range(1, len(rows) + 1))
    assert store.record("after", turns("q"), "r", "up") > max(printed)  # still writable


def test_both_backends_keep_the_same_records_refusals_and_datasets(postgres, tmp_path):
    """The same writes give the same records, ids, ranges, refusals and datasets in both stores."""
    url = postgres.create_database()
    pg = PostgresFeedbackStore(url, "support")
    lite = SQLiteFeedbackStore(tmp_path / "f.sqlite")
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
    assert pg.refusals == lite.refusals and len(pg.refusals) == 4
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
