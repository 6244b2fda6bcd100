"""The append-only feedback store (real SQLite files, real writer processes) and the datasets it yields."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dragon_dagster.engine.data.feedback_rows import (
    SKIP_REASONS,
    check_record,
    feedback_prompts,
    objective_records,
    preference_pairs,
    sft_conversations,
    split_by_conversation,
    unpaired_ratings,
    usable_records,
)
from dragon_dagster.engine.data.feedback_store import (
    MAX_MESSAGE_CHARS,
    SCHEMA_VERSION,
    FeedbackError,
    FeedbackStore,
    check_turns,
)
from dragon_dagster.engine.data.tables import conversation_row

ROOT = Path(__file__).resolve().parents[3]  # the repository: the child imports dragon_dagster from it


def turns(*texts: str) -> list[dict]:
    roles = ["user", "assistant"]
    return [{"role": roles[i % 2], "content": t} for i, t in enumerate(texts)]


def test_schema_wal_and_round_trip(tmp_path):
    store = FeedbackStore(tmp_path / "feedback" / "feedback.sqlite")
    assert store.count() == 0 and store.max_id() == 0 and store.records() == []
    assert store.journal_mode() == "wal"
    with sqlite3.connect(store.path) as conn:
        columns = {row[1] for row in conn.execute("PRAGMA table_info(feedback)")}
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 5
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
    conn = store._connect()
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    conn.close()

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
    assert not hasattr(store, "delete") and not hasattr(store, "update")
    # another store object on the same file sees the same data
    assert FeedbackStore(store.path).records() == rows


def test_invalid_feedback_is_refused(tmp_path):
    store = FeedbackStore(tmp_path / "f.sqlite")
    for kwargs in (
        {"verdict": "meh"},
        {"verdict": "edit"},
        {"verdict": "edit", "edited": "  "},
        {"verdict": "up", "edited": "x"},
        {"verdict": "up", "turns": []},
        {"verdict": "up", "turns": [{"role": "assistant", "content": "only"}]},
        {"verdict": "up", "turns": [{"role": "robot", "content": "x"}]},
    ):
        kwargs = {"conversation_id": "c", "turns": turns("q"), "reply": "r", **kwargs}
        with pytest.raises(ValueError):
            store.record(**kwargs)
    assert isinstance(FeedbackError("x"), ValueError)
    assert store.count() == 0


def _writer(path, worker, n, start):
    start.wait(30)
    store = FeedbackStore(path)
    for i in range(n):
        store.record(f"p{worker}", turns(f"q{worker}-{i}"), f"r{i}", "up", model="m")


def test_concurrent_writers_lose_nothing(tmp_path):
    path = tmp_path / "f.sqlite"
    store = FeedbackStore(path)  # the file is created by the writers themselves: no store._ensure() here
    ctx = multiprocessing.get_context("fork")
    start = ctx.Event()
    procs = [ctx.Process(target=_writer, args=(path, w, 4, start)) for w in range(10)]
    ids, errors = [], []

    def thread_writer(t):
        start.wait(30)
        try:
            ids.append(store.record(f"t{t}", turns(f"thread {t}"), "r", "down"))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=thread_writer, args=(t,)) for t in range(10)]
    for p in procs:
        p.start()
    for t in threads:
        t.start()
    start.set()
    for p in procs:
        p.join(60)
    for t in threads:
        t.join(60)
    assert [p.exitcode for p in procs] == [0] * 10 and not errors
    rows = store.records()
    assert store.count() == 50 and len({r["id"] for r in rows}) == 50
    assert set(ids) <= {r["id"] for r in rows} and len(ids) == 10
    assert sorted(r["turns"][0]["content"] for r in rows if r["conversation_id"].startswith("p")) == sorted(
        f"q{w}-{i}" for w in range(10) for i in range(4)
    )


CHILD = """
import sys
from dragon_dagster.engine.data.feedback_store import FeedbackStore
store = FeedbackStore(sys.argv[1])
for i in range(100000):
    fid = store.record("kill", [{"role": "user", "content": f"q{i}"}], "r" * 2000, "up")
    print(fid, flush=True)
"""


def test_acknowledged_writes_survive_sigkill(tmp_path):
    path = tmp_path / "f.sqlite"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path)], stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT
    )
    printed = []
    deadline = time.monotonic() + 60
    try:
        while len(printed) < 25 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            printed.append(int(line))
        proc.send_signal(signal.SIGKILL)  # mid-stream: the child is busy writing the next records
        rest = proc.stdout.read()
    finally:
        proc.kill()
        proc.wait()
    printed += [int(x) for x in rest.split()]
    assert proc.returncode == -signal.SIGKILL and len(printed) >= 25
    stored = {r["id"] for r in FeedbackStore(path).records()}
    assert set(printed) <= stored
    assert FeedbackStore(path).record("after", turns("q"), "r", "up") > max(printed)  # still writable


def record(i, conversation, history, reply, verdict, edited=None):
    return {
        "id": i,
        "conversation_id": conversation,
        "turns": history,
        "reply": reply,
        "verdict": verdict,
        "edited": edited,
        "model": "m",
        "created": "2026-01-01T00:00:00+00:00",
    }


P1, P2, P3 = turns("reset my password?"), turns("hi", "hello", "refund?"), turns("lonely prompt")
CRAFTED = [
    record(1, "a", P1, "Click 'forgot password'.", "up"),
    record(2, "b", P1, "No idea.", "down"),
    record(3, "c", P2, "Refunds take 5 days.", "edit", edited="Refunds take 5 business days."),
    record(4, "d", P3, "meh", "down"),  # a bad reply with no good one: no pair
    record(5, "e", P1, "Click 'forgot password'.", "up"),  # duplicate of 1
    record(6, "f", P3, "changed my mind", "up"),
    record(7, "f", P3, "changed my mind", "down"),  # same reply, same conversation: the later vote wins
]


def test_sft_conversations_from_crafted_records():
    expected = [
        {"messages": P1 + [{"role": "assistant", "content": "Click 'forgot password'."}]},
        {"messages": P2 + [{"role": "assistant", "content": "Refunds take 5 business days."}]},
    ]
    shuffled = [CRAFTED[i] for i in (4, 2, 6, 0, 3, 1, 5)]
    assert sft_conversations(CRAFTED) == expected
    assert sft_conversations(shuffled) == expected  # ordered by id, whatever the input order
    assert conversation_row(expected[1]["messages"]) == {
        "prompt": P2,
        "completion": [{"role": "assistant", "content": "Refunds take 5 business days."}],
    }
    assert sft_conversations([]) == []


def test_preference_pairs_from_crafted_records():
    pairs = preference_pairs(CRAFTED)
    assert pairs == [
        {
            "prompt": P1,
            "chosen": [{"role": "assistant", "content": "Click 'forgot password'."}],
            "rejected": [{"role": "assistant", "content": "No idea."}],
        },
        {
            "prompt": P2,
            "chosen": [{"role": "assistant", "content": "Refunds take 5 business days."}],
            "rejected": [{"role": "assistant", "content": "Refunds take 5 days."}],
        },
        # P3: "changed my mind" ends up disliked and "meh" too: no good reply, no pair
    ]
    # an edit plus a separate dislike on the same prompt: every good x bad combination, deduplicated
    more = CRAFTED + [
        record(8, "g", P2, "Ask someone else.", "down"),
        record(9, "h", P2, "Refunds take 5 days.", "down"),
    ]
    rejected = [p["rejected"][0]["content"] for p in preference_pairs(more) if p["prompt"] == P2]
    assert rejected == ["Refunds take 5 days.", "Ask someone else."]
    assert preference_pairs(list(reversed(more))) == preference_pairs(more)


def test_unpaired_ratings_are_the_votes_no_pair_uses():
    # P1 (liked and disliked) and P2 (an edit) give pairs; P3's votes have no opposite: KTO gets them
    assert unpaired_ratings(CRAFTED) == [
        {"prompt": P3, "completion": [{"role": "assistant", "content": "meh"}], "label": False},
        {"prompt": P3, "completion": [{"role": "assistant", "content": "changed my mind"}], "label": False},
    ]
    liked_alone = [record(1, "a", P1, "Click 'forgot password'.", "up")]
    assert unpaired_ratings(liked_alone) == [
        {"prompt": P1, "completion": [{"role": "assistant", "content": "Click 'forgot password'."}], "label": True}
    ]
    assert objective_records(CRAFTED) == {
        "sft": [1, 3, 5],
        "dpo": [1, 2, 3, 5],
        "kto": [4, 7],
        "rlhf": [1, 2, 3, 4, 5, 7],  # every rated turn is a prompt to sample fresh replies to
    }


def test_feedback_prompts_are_each_rated_turns_once():
    records = [
        record(1, "c1", turns("q1"), "a", "up"),
        record(2, "c1", turns("q1"), "b", "down"),
        record(3, "c2", turns("q2"), "c", "edit", edited="better"),
        record(4, "c3", "not json", "d", "up"),  # skipped, as everywhere
    ]
    assert feedback_prompts(records) == [{"prompt": turns("q1")}, {"prompt": turns("q2")}]


def test_held_out_conversations_are_whole_and_stable():
    records = [record(i, f"c{i // 2}", turns(f"q{i}"), "r", "up") for i in range(20)]  # 10 conversations
    train, held = split_by_conversation(records, 0.2)
    assert len({r["conversation_id"] for r in held}) == 2 and len(held) == 4
    assert not {r["conversation_id"] for r in held} & {r["conversation_id"] for r in train}
    assert split_by_conversation(list(reversed(records)), 0.2)[1] == list(reversed(held))  # same conversations
    assert split_by_conversation(records[:2], 0.2) == (records[:2], [])  # one conversation: nothing held out
    assert len(split_by_conversation(records[:4], 0.2)[1]) == 2  # two: one held out, one trained on
    assert split_by_conversation(records, 0) == (records, [])


def test_store_records_feed_the_datasets(tmp_path):
    store = FeedbackStore(tmp_path / "f.sqlite")
    for r in CRAFTED:
        store.record(r["conversation_id"], r["turns"], r["reply"], r["verdict"], edited=r["edited"], model="m")
    records = store.records()
    assert sft_conversations(records) == sft_conversations(CRAFTED)
    assert preference_pairs(records) == preference_pairs(CRAFTED)
    watermark = records[2]["id"]
    assert len(preference_pairs(store.records(up_to_id=watermark))) == 2
    assert preference_pairs(store.records(after_id=watermark)) == []


# ------------------------------------------------------------------------------------ bad records

BAD = [
    record(20, "x", "[{not json", "r", "up"),  # turns not JSON
    record(21, "x", [{"role": "assistant", "content": "only me"}], "r", "up"),  # no user turn
    record(22, "x", P1, "Click 'forgot password'.", "edit", edited=None),  # an edit without text
    record(23, "x", P1, "No idea.", "edit", edited="   "),  # an edit with blank text
    record(24, "x", [{"role": "robot", "content": "beep"}], "r", "up"),  # malformed turns
    record(25, "x", None, "r", "up"),  # no turns at all
    record(26, "x", P1, "r", "meh"),  # bad verdict
    record(27, "x", P1, None, "down"),  # reply not text
    "not a record",
]


def test_bad_records_are_skipped_and_counted_never_raised():
    mixed = BAD[:4] + CRAFTED + BAD[4:]
    assert sft_conversations(mixed) == sft_conversations(CRAFTED)
    assert preference_pairs(mixed) == preference_pairs(CRAFTED)
    usable, skipped = usable_records(mixed)
    assert [r["id"] for r in usable] == [r["id"] for r in CRAFTED]
    assert skipped == {
        "turns_not_json": 1,
        "no_user_turn": 1,
        "edit_without_text": 2,
        "turns_malformed": 2,
        "bad_verdict": 1,
        "reply_not_text": 1,
        "malformed": 1,
    }
    assert set(skipped) <= set(SKIP_REASONS) and check_record(CRAFTED[0]) is None
    assert [check_record(r) for r in BAD[:3]] == ["turns_not_json", "no_user_turn", "edit_without_text"]
    # turns given as JSON text are fine when they parse
    assert check_record({**CRAFTED[0], "turns": json.dumps(P1)}) is None
    assert usable_records(BAD) == (
        [],
        {
            "turns_not_json": 1,
            "no_user_turn": 1,
            "edit_without_text": 2,
            "turns_malformed": 2,
            "bad_verdict": 1,
            "reply_not_text": 1,
            "malformed": 1,
        },
    )
    with pytest.raises(FeedbackError, match="not JSON"):  # not a raw JSONDecodeError
        check_turns("[{not json")


def test_bad_rows_in_a_real_store_are_skipped(tmp_path):
    """Rows the API refuses can still be in a file (first-layout data, another writer): reading them and
    building datasets from them skips and counts them."""
    store = FeedbackStore(tmp_path / "f.sqlite")
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

    store = FeedbackStore(path)
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
    assert FeedbackStore(path).records()[:-1] == rows  # opening again does not migrate twice


def test_turns_are_stored_once_per_conversation(tmp_path):
    store = FeedbackStore(tmp_path / "f.sqlite")
    history = [{"role": "system", "content": "S"}, {"role": "user", "content": "y" * 30_000}]
    for i in range(20):
        store.record("c", history, f"reply {i}", "up")
        history = history + [{"role": "assistant", "content": f"reply {i}"}, {"role": "user", "content": f"q{i}"}]
    store.record("other", history[:2], "another reply", "down")  # the same opening, another conversation
    with sqlite3.connect(store.path) as conn:
        assert conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 2 + 19 * 2
        assert conn.execute("SELECT SUM(LENGTH(content)) FROM messages").fetchone()[0] < 31_000
    rows = store.records()
    assert len(rows[-2]["turns"]) == 2 + 19 * 2 and rows[-2]["turns"][1]["content"] == "y" * 30_000
    assert rows[-1]["turns"] == history[:2] and rows[-1]["turns_id"] == rows[0]["turns_id"]
    assert [r["id"] for r in store.records(after_id=5, up_to_id=7)] == [6, 7]
    assert store.records(after_id=5, up_to_id=7)[1]["turns"] == rows[6]["turns"]


def test_store_refuses_over_long_messages_with_the_limit(tmp_path):
    store = FeedbackStore(tmp_path / "f.sqlite")
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
    assert FeedbackStore(tmp_path / "big.sqlite", max_message_chars=None).record("c", turns("q" * 100_000), "r", "up")


# ------------------------------------------------------------------------------------------- tool turns

CALL = {"type": "function", "function": {"name": "order_status", "arguments": {"order_id": "A1042"}}}
TOOL_TURNS = [
    {"role": "system", "content": "Look orders up."},
    {"role": "user", "content": "Where is A1042?"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "name": "order_status", "content": '{"status": "shipped"}'},
]


def test_tool_turns_are_stored_and_come_back_in_the_datasets(tmp_path):
    """A chat's tool-call turn and tool turn survive the store and stay in the prompt of every row made from the
    record; a tool turn after no call is refused (it would not render)."""
    store = FeedbackStore(tmp_path / "f.sqlite")
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
    with sqlite3.connect(store.path) as conn:
        extra = conn.execute("SELECT extra FROM messages WHERE role = 'tool'").fetchone()[0]
    assert json.loads(extra) == {"name": "order_status"}
    for bad in (
        [{"role": "user", "content": "q"}, {"role": "tool", "content": "x"}],  # a result nothing asked for
        [{"role": "user", "content": "q", "tool_calls": [CALL]}],  # only an assistant calls
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [{"nope": 1}]}],
    ):
        with pytest.raises(FeedbackError):
            store.record("e", bad, "r", "up")
    assert check_record(record(9, "e", bad, "r", "up")) == "turns_malformed"


def test_a_version_2_store_gets_the_extra_column_and_keeps_its_messages(tmp_path):
    path = tmp_path / "f.sqlite"
    FeedbackStore(path).record("c", turns("q", "a", "q2"), "r", "up")
    with sqlite3.connect(path) as conn:  # what version 2 wrote: messages without the extra column
        conn.execute("ALTER TABLE messages DROP COLUMN extra")
        conn.execute("PRAGMA user_version = 2")
    store = FeedbackStore(path)
    assert store.records()[0]["turns"] == turns("q", "a", "q2")
    store.record("c", turns("q", "a", "q2"), "r2", "down")  # the same turns: found again by their digest
    store.record("c", TOOL_TURNS, "It shipped.", "up")
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 3 + 4
    assert [r["turns"] for r in store.records()] == [turns("q", "a", "q2")] * 2 + [TOOL_TURNS]


def test_a_version_3_store_gets_the_trace_id_column_and_keeps_its_records(tmp_path):
    path = tmp_path / "f.sqlite"
    FeedbackStore(path).record("c", turns("q"), "r", "up")
    with sqlite3.connect(path) as conn:  # what version 3 wrote: feedback without the trace_id column
        conn.execute("ALTER TABLE feedback DROP COLUMN trace_id")
        conn.execute("PRAGMA user_version = 3")
    store = FeedbackStore(path)
    [old] = store.records()
    assert old["trace_id"] is None and old["reply"] == "r"
    new = store.record("c", turns("q"), "r2", "down", trace_id="tr-123")
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 5
    assert [(r["id"], r["trace_id"]) for r in store.records()] == [(old["id"], None), (new, "tr-123")]
