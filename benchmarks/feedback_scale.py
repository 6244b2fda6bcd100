"""The feedback store at 10k, 100k and 1M records (issue 63): the chat page's writes, the retraining sensor's query
and the retraining dataset's build, on SQLite and on PostgreSQL, as the store grows.

    python benchmarks/feedback_scale.py                          # 10k, 100k, 1M; SQLite and a throwaway cluster
    python benchmarks/feedback_scale.py --sizes 10000 100000 --backends sqlite --json out.json
    python benchmarks/feedback_scale.py --postgres-url URL       # an existing database (schema feedback_scale)

One store per backend grows through the sizes (smallest first). It is filled in bulk (executemany on SQLite, COPY
on PostgreSQL) with records as chats make them: conversations of 1-7 rated replies, each record's turns the
conversation so far (a shared system prompt, an opening shared by many conversations, then the conversation's own
turns), so stored prefixes are shared as they are in a real store. At each size it measures:

- the sensor's tick: opening the store, `count(after_id=used)` and `max_id()`, as `feedback_sensor` calls them,
  with the last retraining 1,000 records ago and with none yet (every record new: the worst case); median of 5;
- the live gate sensor's look on a tick with new ratings: every version's counts (the store's GROUP BY,
  `verdict_counts`) and each version's first 200 ratings since the challenger began waiting (1,000 records ago,
  `first_ratings`); beside it, reading every rating without its turns (`ratings()`), which it read before;
- SQLite: opening a store of schema version 5 (before the id index), which builds the index;
- the retraining dataset's build for the records since the last retraining (the last 1,000 and 10,000): reading
  them (`records()`) and making every objective's rows (`FeedbackRange.of`), its time and the process's peak
  memory above what it held before, in a fresh process;
- the chat page's writes: `record()` of 200 ratings (half continue a stored conversation, half start one), one
  writer, records/s.

A SQLite store is kept in --dir and grown from where it is on the next run (the fill is resumable); PostgreSQL's
throwaway cluster is filled afresh (COPY: about a minute for 1M records). Prints a markdown table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import closing
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dragon_dagster.engine.data.feedback.opener import open_feedback_store  # noqa: E402
from dragon_dagster.engine.data.feedback.sql import message_digest  # noqa: E402

NAME = "scale"  # the pipeline (PostgreSQL: schema feedback_scale)
SYSTEMS = ["You answer support tickets for an online shop.", "You are a helpful assistant.", "Answer briefly."]
OPENINGS = [f"Hello, I have a question about {w}." for w in ("my order", "a refund", "delivery", "my account")] + [
    f"Hi! Order {n} has not arrived." for n in range(40)
]
WORDS = (
    "order parcel refund delivery address invoice account password card payment tracking courier return label "
    "week today tomorrow please thanks help broken missing wrong size colour again still waiting email phone"
).split()
WRITES = 200


def _text(rng: random.Random, lo: int, hi: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def conversation(i: int) -> tuple[str, list[dict], list[tuple]]:
    """Conversation i (the same every run): its id, its messages in order, and its records (index of the last
    message before the rated reply, reply, verdict, edited). The rated reply is the next assistant message."""
    rng = random.Random(i)
    messages = [{"role": "system", "content": rng.choice(SYSTEMS)}, {"role": "user", "content": rng.choice(OPENINGS)}]
    records = []
    for turn in range(rng.randint(1, 7)):
        if turn:
            messages.append({"role": "user", "content": _text(rng, 5, 30)})
        reply = _text(rng, 20, 60)
        verdict = rng.choice(("up", "up", "down", "edit"))
        records.append((len(messages) - 1, reply, verdict, _text(rng, 20, 60) if verdict == "edit" else None))
        messages.append({"role": "assistant", "content": reply})
    return f"c{i}", messages, records


class Filler:
    """Bulk rows for a store's two tables, continuing its ids: message ids are assigned here, prefixes shared with
    the messages already stored (the shared system prompts and openings are looked up once)."""

    def __init__(self, next_message: int, known: dict[tuple[int, str], int]):
        self.next_message = next_message
        self.known = known  # (parent, digest) -> id of the shared messages
        self.messages: list[tuple] = []
        self.feedback: list[tuple] = []

    def add(self, i: int, upto: int | None, next_record: int) -> int:
        """Conversation i's records (the first `upto` of them when given) as rows; how many records it gave."""
        cid, messages, records = conversation(i)
        records = records[:upto] if upto is not None else records
        last_needed = records[-1][0]
        ids, parent = [], 0
        for depth, m in enumerate(messages[: last_needed + 1]):
            digest = message_digest(m["role"], m["content"])
            shared = depth < 2  # a system prompt and an opening: shared by many conversations
            found = self.known.get((parent, digest)) if shared else None
            if found is None:
                found = self.next_message
                self.next_message += 1
                self.messages.append((found, parent, m["role"], m["content"], digest, None))
                if shared:
                    self.known[(parent, digest)] = found
            ids.append(found)
            parent = found
        created = "2026-12-07T00:00:00.000000+00:00"
        for n, (last, reply, verdict, edited) in enumerate(records):
            self.feedback.append(
                (next_record + n, cid, ids[last], reply, verdict, edited, version(i), created, None, None)
            )
        return len(records)


FEEDBACK_COLUMNS = "id, conversation_id, turns_id, reply, verdict, edited, model, created, trace_id, record_key"
MESSAGE_COLUMNS = "id, parent, role, content, digest, extra"


def fill(url: str, path: str, target: int, chunk: int = 50_000) -> float:
    """Grow the store to `target` records in bulk; seconds taken. Conversations are numbered by the records before
    them, so a store grows from wherever it stopped."""
    store = open_feedback_store(url, NAME, path)
    store.check()
    began = time.perf_counter()
    while True:
        have = store.max_id()
        if have >= target:
            if url:  # the planner's statistics for the grown tables, as autovacuum would give them soon
                conn, _ = _connect(url, path)
                conn.execute("VACUUM ANALYZE messages")
                conn.execute("VACUUM ANALYZE feedback")
                conn.close()
            return time.perf_counter() - began
        conn, pg = _connect(url, path)
        try:
            cur = conn.execute("SELECT COALESCE(MAX(id), 0) FROM messages")
            next_message = int(cur.fetchone()[0]) + 1
            shared = conn.execute(
                "SELECT parent, digest, id FROM messages WHERE parent = 0 OR parent IN "
                "(SELECT id FROM messages WHERE parent = 0)"
            ).fetchall()
            filler = Filler(next_message, {(p, d): i for p, d, i in shared})
            # the conversation to go on with: the one after the newest record's (ids c0, c1, ...)
            row = conn.execute(  # the benchmark's own writes (w...) come after the bulk ones
                "SELECT conversation_id FROM feedback WHERE conversation_id LIKE 'c%' ORDER BY id DESC LIMIT 1"
            ).fetchone()
            i = int(row[0][1:]) + 1 if row else 0
            n = have
            while n < min(target, have + chunk):
                n += filler.add(i, min(target, have + chunk) - n, n + 1)
                i += 1
            _bulk(conn, pg, filler)
        finally:
            conn.close()


def _connect(url: str, path: str):
    if url:
        import psycopg

        conn = psycopg.connect(url, autocommit=True)
        conn.execute(f"SET search_path TO feedback_{NAME}")
        return conn, True
    import sqlite3

    return sqlite3.connect(path), False


def _bulk(conn, pg: bool, filler: Filler) -> None:
    if pg:
        with conn.transaction():
            with conn.cursor().copy(f"COPY messages ({MESSAGE_COLUMNS}) FROM STDIN") as copy:
                for row in filler.messages:
                    copy.write_row(row)
            with conn.cursor().copy(f"COPY feedback ({FEEDBACK_COLUMNS}) FROM STDIN") as copy:
                for row in filler.feedback:
                    copy.write_row(row)
            # rows copied with their ids: the messages' sequence goes on after them
            conn.execute("SELECT setval(pg_get_serial_sequence('messages', 'id'), (SELECT MAX(id) FROM messages))")
        return
    with conn:
        conn.executemany(f"INSERT INTO messages ({MESSAGE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)", filler.messages)
        conn.executemany(
            f"INSERT INTO feedback ({FEEDBACK_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", filler.feedback
        )


def _median_s(work, times: int = 5) -> float:
    spent = []
    for _ in range(times):
        began = time.perf_counter()
        work()
        spent.append(time.perf_counter() - began)
    return statistics.median(spent)


def upgrade_s(path: str) -> float:
    """Seconds a SQLite store of schema version 5 (no id index) takes to open at the current version."""
    import sqlite3

    with closing(sqlite3.connect(path)) as conn:
        conn.execute("DROP INDEX IF EXISTS feedback_ids")
        conn.execute("PRAGMA user_version = 5")
        conn.commit()
    began = time.perf_counter()
    open_feedback_store("", NAME, path).check()
    return time.perf_counter() - began


def version(i: int) -> str:
    """The registered version that answered conversation i, as `dragon serve` records it: champion and challenger
    sharing the traffic 4 to 1."""
    return f"models:/{NAME}/{2 if i % 5 == 0 else 1}"


def live_look(url: str, path: str, waiting_since: int) -> dict:
    """What the live gate sensor reads on a tick that has new ratings (assets/live_gate.py): every version's counts
    up to the newest record, then each version's first 200 ratings since the challenger began waiting."""
    from dragon_dagster.engine.evaluate.live_rates import Ratings

    store = open_feedback_store(url, NAME, path)
    ratings = Ratings(store, NAME, store.max_id())
    return {"rates": ratings.rates(), "first": len(ratings.first(["1", "2"], waiting_since, 200))}


def sensor_tick(url: str, path: str, used: int) -> tuple[int, int]:
    """What feedback_sensor asks the store on a tick (assets/automation.py), on a store opened as it opens one."""
    store = open_feedback_store(url, NAME, path)
    return store.count(after_id=used), store.max_id()


def build(url: str, path: str, last_n: int) -> dict:
    """The retraining dataset's build for the newest `last_n` records, in a fresh process: seconds and peak MB."""
    code = (
        "import json, sys\n"
        f"sys.path.insert(0, {str(ROOT / 'benchmarks')!r})\n"
        "from feedback_scale import build_here\n"
        f"print(json.dumps(build_here({url!r}, {path!r}, {last_n})))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    return 0.0


def build_here(url: str, path: str, last_n: int) -> dict:
    from dragon_dagster.engine.pipeline.objectives import FeedbackRange

    store = open_feedback_store(url, NAME, path)
    newest = store.max_id()
    first = max(1, newest - last_n + 1)
    # the peak from here: getrusage's ru_maxrss would carry the parent's peak over fork and exec (Linux), so the
    # kernel's high-water mark is reset instead (clear_refs 5) and read back as VmHWM
    Path("/proc/self/clear_refs").write_text("5")
    before = _status_mb("VmRSS")
    began = time.perf_counter()
    records = store.records(after_id=first - 1, up_to_id=newest)
    read_s = time.perf_counter() - began
    found = FeedbackRange.of(records, first, newest, 0.2)
    total_s = time.perf_counter() - began
    peak = _status_mb("VmHWM")
    return {
        "records": len(records),
        "read_s": read_s,
        "build_s": total_s,
        "peak_mb_above_start": peak - before,
        "rows": {name: len(train) + len(held) for name, (train, held) in found.rows.items()},
    }


def writes(url: str, path: str, n: int = WRITES) -> float:
    """record() as the chat page calls it, n times: half a new turn of a stored conversation, half a new one;
    records per second."""
    store = open_feedback_store(url, NAME, path)
    store.check()
    newest = store.max_id()
    rng = random.Random(newest)
    stored = [
        int(r["conversation_id"][1:])
        for r in store.records(after_id=max(0, newest - 2000), up_to_id=newest)
        if r["conversation_id"].startswith("c")
    ]
    began = time.perf_counter()
    for k in range(n):
        if k % 2 and stored:
            _, messages, _ = conversation(rng.choice(stored))
            turns = [*messages, {"role": "user", "content": f"and one more thing {newest}-{k}"}]
        else:
            turns = [
                {"role": "system", "content": SYSTEMS[0]},
                {"role": "user", "content": f"new question {newest}-{k}"},
            ]
        store.record(f"w{newest}-{k}", turns, "a reply " * 30, "up" if k % 3 else "down", model=version(newest + k))
    return n / (time.perf_counter() - began)


def measure(url: str, path: str, size: int) -> dict:
    fill_s = fill(url, path, size)
    upgrade = None if url else upgrade_s(path)
    newest = open_feedback_store(url, NAME, path).max_id()
    recent = max(0, newest - 1000)
    out = {
        "records": newest,
        "fill_s": fill_s,
        "upgrade_from_5_s": upgrade,
        "sensor_tick_s": _median_s(lambda: sensor_tick(url, path, recent)),
        "sensor_tick_none_used_s": _median_s(lambda: sensor_tick(url, path, 0)),
        "live_look_s": _median_s(lambda: live_look(url, path, recent), times=3),
        "ratings_all_s": _median_s(lambda: open_feedback_store(url, NAME, path).ratings(), times=3),
        "build_1k": build(url, path, 1000),
        "build_10k": build(url, path, 10_000) if newest >= 10_000 else None,
    }
    out["writes_per_s"] = writes(url, path)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--backends", nargs="+", default=["sqlite", "postgresql"], choices=["sqlite", "postgresql"])
    parser.add_argument("--dir", default=str(Path(tempfile.gettempdir()) / "feedback-scale"), help="the SQLite store")
    parser.add_argument("--postgres-url", default="", help="an existing database; default: a throwaway cluster")
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    results: dict[str, list[dict]] = {}
    server = None
    try:
        for backend in args.backends:
            if backend == "sqlite":
                Path(args.dir).mkdir(parents=True, exist_ok=True)
                url, path = "", str(Path(args.dir) / "feedback.sqlite")
            else:
                if not args.postgres_url:
                    from tests.postgres import PostgresServer  # the tests' throwaway cluster

                    server = PostgresServer()
                url, path = args.postgres_url or server.create_database(), ""
            for size in sorted(args.sizes):
                got = measure(url, path, size)
                results.setdefault(backend, []).append(got)
                print(f"{backend} {size}: {json.dumps(got)}", file=sys.stderr, flush=True)
    finally:
        if server is not None:
            server.remove()
    print(
        "| store | records | fill s | upgrade from v5 s | sensor tick ms (used 1k ago / none used) | live gate look s "
        "(every rating read s) | "
        "build last 1k: s (read s), MB | build last 10k: s (read s), MB | record() writes/s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for backend, rows in results.items():
        for r in rows:
            b1, b10 = r["build_1k"], r["build_10k"]
            upgrade = "-" if r["upgrade_from_5_s"] is None else f"{r['upgrade_from_5_s']:.2f}"
            print(
                f"| {backend} | {r['records']:,} | {r['fill_s']:.1f} | {upgrade} | {1000 * r['sensor_tick_s']:.1f} / "
                f"{1000 * r['sensor_tick_none_used_s']:.1f} | {r['live_look_s']:.2f} ({r['ratings_all_s']:.2f}) | "
                f"{b1['build_s']:.2f} ({b1['read_s']:.2f}), {b1['peak_mb_above_start']:.0f} | "
                + (f"{b10['build_s']:.2f} ({b10['read_s']:.2f}), {b10['peak_mb_above_start']:.0f}" if b10 else "-")
                + f" | {r['writes_per_s']:.0f} |"
            )
    line = json.dumps({"benchmark": "feedback_scale", "cpus": os.cpu_count(), "results": results})
    print(line)
    if args.json:
        Path(args.json).write_text(line + "\n")


if __name__ == "__main__":
    main()
