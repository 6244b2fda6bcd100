"""How long a job waits for its worker: launch to the worker's first line and launch to its exit, for a worker
forked by the warm worker and for a fresh interpreter (cold), in interleaved rounds, medians with ranges.

    python benchmarks/worker_start.py                    # 5 rounds of a 2-step SFT job on the tiny model
    python benchmarks/worker_start.py --rounds 9 --json out.json

Each launch is what the subprocess launcher does (engine/runtime/warm/client.py's start) from a small launcher
process whose stdout is a pipe this script reads: the clock starts just before start() and stops at the worker's
first printed line (its imports done, the job parsed, the model loading) and at its exit. The rounds alternate
which start goes first. The warm worker's own start (its imports, once per interpreter) is timed too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LAUNCH = textwrap.dedent("""\
    import os, sys, time
    from dragon_dagster.engine.runtime.warm import client
    from dragon_dagster.engine.runtime.worker import PARENT_PID
    warm = sys.argv[1] == "warm"
    started = time.time()
    proc, how = client.start(sys.argv[2:], {**os.environ, PARENT_PID: str(os.getpid())}, warm=warm)
    print(f"LAUNCHED {started} {how}", file=sys.stderr, flush=True)
    sys.exit(proc.wait())
    """)


def launch(mode: str, job: Path) -> dict:
    argv = [sys.executable, "-m", "dragon_dagster.engine.runtime.worker", str(job)]
    proc = subprocess.Popen(
        [sys.executable, "-c", LAUNCH, mode, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT
    )
    first = proc.stdout.readline()
    first_at = time.time()
    proc.stdout.read()
    proc.wait()
    ended = time.time()
    launched = next(line for line in proc.stderr.read().decode().splitlines() if line.startswith("LAUNCHED"))
    _, started, how = launched.split(" ", 2)
    assert how.startswith(f"{mode} start"), how
    assert proc.returncode == 0 and first, (mode, proc.returncode)
    return {"first_line_s": first_at - float(started), "exit_s": ended - float(started)}


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):6.2f} s  ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ["DRAGON_WARM_DIR"] = tempfile.mkdtemp(prefix="warm-bench-")  # a warm worker of its own, timed
    from dragon_dagster.engine import models
    from dragon_dagster.engine.runtime.warm import client
    from tests.support import sft_job, ticket_files

    root = Path(tempfile.mkdtemp(prefix="worker-start-"))
    tiny = models.build_tiny_model(root / "tiny", tokenizer_from=str(models.embedded_model_dir()))
    train, held = ticket_files(root, 40)

    def job(name: str) -> Path:
        folder = root / name
        folder.mkdir()
        path = folder / "job.json"
        path.write_text(sft_job(folder, tiny, train, held, max_steps=2).model_dump_json())
        return path

    started = time.monotonic()
    boot = launch("warm", job("boot"))  # starts the warm worker: its imports, then the first fork
    warm_boot_s = time.monotonic() - started
    figures: dict[str, list[dict]] = {"warm": [], "cold": []}
    for n in range(args.rounds):
        for mode in ("warm", "cold") if n % 2 == 0 else ("cold", "warm"):
            figures[mode].append(launch(mode, job(f"{mode}-{n}")))
    print(f"2-step SFT job on the tiny model, {args.rounds} interleaved rounds, {os.cpu_count()} CPUs")
    print(f"warm worker started and first job's first line: {boot['first_line_s']:.2f} s ({warm_boot_s:.1f} s to exit)")
    for what in ("first_line_s", "exit_s"):
        for mode in ("warm", "cold"):
            print(f"{mode:4s} launch to {what[:-2].replace('_', ' '):10s} {summary([f[what] for f in figures[mode]])}")
    ratio = [c["first_line_s"] / w["first_line_s"] for w, c in zip(figures["warm"], figures["cold"])]
    print(f"cold/warm to first line, pair by pair: {summary(ratio).replace(' s', ' x')}")
    client.stop()
    if args.json:
        args.json.write_text(json.dumps({"rounds": args.rounds, "boot": boot, **figures}, indent=2))


if __name__ == "__main__":
    main()
