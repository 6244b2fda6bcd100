"""How fast the feedback store takes ratings from several writer processes: SQLite (one WAL file, the default) and
PostgreSQL (issue 31), in interleaved rounds, medians with ranges.

    python benchmarks/feedback_writers.py                       # a throwaway local PostgreSQL cluster
    python benchmarks/feedback_writers.py --postgres-url URL     # an existing database (its feedback_bench schema)
    python benchmarks/feedback_writers.py --writers 1 4 8 --records 100 --rounds 3 --json out.json

Each writer is a process that records `--records` ratings as a chat server does: a conversation whose opening
is shared, a 300-character reply, one `record()` call each, acknowledged when committed. A round runs every
backend once per writer count, in alternating order; the figures are records per second over the round's wall
time (all writers started together) and each record's latency (p50, p95). A fresh store per run.

PostgreSQL here runs on the same machine with fsync on; over a network each commit adds a round trip.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dragon_dagster.engine.data.feedback.opener import open_feedback_store  # noqa: E402

OPENING = [{"role": "system", "content": "You answer support tickets."}, {"role": "user", "content": "Hello"}]


def _write(url: str, path: str, name: str, worker: int, n: int, start, out) -> None:
    store = open_feedback_store(url, name, path)
    start.wait(60)
    latencies = []
    for i in range(n):
        turns = [
            *OPENING,
            {"role": "assistant", "content": "Hi, how can I help?"},
            {"role": "user", "content": f"q{worker}-{i}"},
        ]
        began = time.perf_counter()
        store.record(f"w{worker}", turns, "r" * 300, "up" if i % 3 else "down", model="bench")
        latencies.append(time.perf_counter() - began)
    out.put(latencies)


def run(url: str, path: str, name: str, writers: int, records: int) -> dict:
    """`url`: a PostgreSQL database (the `name` schema), or empty for the SQLite file at `path`."""
    open_feedback_store(url, name, path).check()  # created before the clock starts
    ctx = multiprocessing.get_context("fork")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_write, args=(url, path, name, w, records, start, out)) for w in range(writers)]
    for p in procs:
        p.start()
    time.sleep(0.5)  # every writer connected and waiting
    began = time.perf_counter()
    start.set()
    latencies = [x for _ in procs for x in out.get(timeout=600)]
    wall = time.perf_counter() - began
    for p in procs:
        p.join(60)
    stored = open_feedback_store(url, name, path).count()
    assert stored == writers * records, f"{stored} stored of {writers * records}"
    latencies.sort()
    return {
        "records_per_s": writers * records / wall,
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p95_ms": 1000 * latencies[int(len(latencies) * 0.95)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--postgres-url", default="", help="an existing database; default: a throwaway cluster")
    parser.add_argument("--writers", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--records", type=int, default=100, help="per writer")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default="")
    args = parser.parse_args()

    server = None
    if not args.postgres_url:
        from tests.postgres import PostgresServer  # the tests' throwaway cluster: Debian's package, loopback

        server = PostgresServer()
    scratch = Path(tempfile.mkdtemp(prefix="feedback-bench-"))
    results: dict[str, dict[int, list[dict]]] = {"sqlite": {}, "postgresql": {}}
    try:
        n = 0
        for r in range(args.rounds):
            for writers in args.writers:
                order = ["sqlite", "postgresql"] if r % 2 == 0 else ["postgresql", "sqlite"]
                for backend in order:
                    n += 1
                    if backend == "sqlite":
                        url, path, name = "", str(scratch / f"run{n}.sqlite"), ""
                    else:
                        url, path = args.postgres_url or server.create_database(), ""
                        name = f"bench{n}"
                    got = run(url, path, name, writers, args.records)
                    results[backend].setdefault(writers, []).append(got)
                    print(
                        f"round {r + 1} {backend:10s} {writers} writer(s): {got['records_per_s']:7.0f} records/s, "
                        f"p50 {got['p50_ms']:.1f} ms, p95 {got['p95_ms']:.1f} ms",
                        flush=True,
                    )
    finally:
        if server is not None:
            server.remove()

    print(f"\n{args.records} records per writer, {args.rounds} interleaved rounds: median (min-max)")
    print("| store | writers | records/s | p50 latency ms | p95 latency ms |\n|---|---:|---:|---:|---:|")
    summary = {}
    for backend, by_writers in results.items():
        for writers, runs in by_writers.items():
            cells = []
            for key in ("records_per_s", "p50_ms", "p95_ms"):
                values = [x[key] for x in runs]
                fmt = "{:.0f}" if key == "records_per_s" else "{:.1f}"
                cells.append(
                    f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"
                )
                summary.setdefault(backend, {}).setdefault(writers, {})[key] = values
            print(f"| {backend} | {writers} | {' | '.join(cells)} |")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
