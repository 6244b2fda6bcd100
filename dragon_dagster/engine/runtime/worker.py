"""Child-process entry point: `python -m dragon_dagster.engine.runtime.worker JOB.json`.

The training resource launches this through Dagster Pipes, so GPU memory is freed when it exits and the
same command can run in a container or on a cluster. It speaks only the Pipes protocol (dagster_pipes, no
dagster): log lines, step metrics and the final result go back to the run as Pipes messages, through whatever
channel the launcher chose (a temp file for a child process, the job's log for Ray, the pod's log for
Kubernetes), so a worker on another node reports exactly as a local one; the parent logs the metrics to MLflow
as they come. The job is parsed by its kind's Job model before anything loads (execution.py). The outcome is
also written to status.json beside the job, readable after a crash exit.

Stopping: SIGINT or SIGTERM (a terminated Dagster run) asks a trainer to save a checkpoint and stop at the end
of its step; any other job (merge, evaluation, synthesis) stops at once. The worker also dies with the
process that started it: a watchdog stops it when its parent is gone, so a killed Dagster step never leaves
a worker training under PID 1.

Data parallelism (a training job with `parallel: {workers: N, backend: ...}`, see distributed.py): under
torchrun every rank runs this module; rank 0 opens Pipes, reports and writes the artifact, the others print
to stdout with a `[rank k]` prefix. With backend "ray" this process is the Ray job's driver: it starts a Ray
Train TorchTrainer whose workers run the stage, and forwards rank 0's lines and metrics (runtime/ray_driver.py).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import NoReturn

from ..config.job import Parallel
from ..train import distributed
from . import library_noise, remote, system_metrics
from .execution import EXIT_CANCELLED, PipesReporter, execute, handle_stop_signals, is_trainer, open_pipes
from .system_metrics import INTERVAL_S
from .warm.protocol import WARM_PARENT

PARENT_PID = "DRAGON_WORKER_PARENT_PID"  # set by the launcher: the watchdog compares os.getppid() with it


def alive(pid: int) -> bool:
    """Whether pid runs: a zombie (dead, not yet reaped by its parent) does not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):  # no /proc here, or it ended meanwhile
        return True


def watch_parent(expected: int, interval_s: float = 1.0, grandparent: bool = False) -> None:
    """Signal this process (SIGTERM, as a terminate would) once its parent has died: reparenting changes
    getppid. A thread, so it works wherever the worker runs; the launcher sets the pid it expects.

    grandparent: the launcher's process is not the parent (torchrun's agent is, under torchrun), so watch
    that it is alive instead, and that the agent is still the parent: torchrun starts each rank in a session
    of its own, out of reach of the launcher's signals to the agent's group, so a rank whose agent was killed
    stops by itself."""
    import threading

    agent = os.getppid()

    def watch():
        while (alive(expected) and os.getppid() == agent) if grandparent else os.getppid() == expected:
            time.sleep(interval_s)
        print(f"worker: parent process {expected if os.getppid() == agent else agent} is gone; stopping", flush=True)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, daemon=True, name="parent-watchdog").start()


def watch_launcher() -> None:
    """Follow the launcher: this process's parent, or its grandparent-like launcher under torchrun and for a worker
    forked by the warm worker (whose parent is the warm process)."""
    if os.environ.get(PARENT_PID):
        forked = bool(os.environ.get(WARM_PARENT))
        watch_parent(int(os.environ[PARENT_PID]), grandparent=distributed.under_torchrun() or forked)


def read_job(source: str) -> tuple[dict, Path | None]:
    """(job, status file) from the job's path, or its URI in an artifact store (a worker on another node:
    no status file then, the Pipes outcome is the only one)."""
    if remote.is_uri(source):
        fs, path = remote.filesystem(source)
        with fs.open(path, "r") as f:
            return json.load(f), None
    return json.loads(Path(source).read_text()), Path(source).parent / "status.json"


def main(argv: list[str] | None = None) -> int:
    argv = argv if argv is not None else sys.argv[1:]
    library_noise.quiet()
    job, status_file = read_job(argv[0])
    parallel = Parallel.model_validate(job["parallel"]) if isinstance(job, dict) and job.get("parallel") else None
    if parallel is not None and parallel.backend == "ray":  # the driver; the ranks run ray_driver.rank_loop
        from . import ray_driver

        return ray_driver.drive(job, parallel, status_file)
    if not distributed.is_main():  # never opens Pipes, writes no status: rank 0 speaks for all
        reporter = distributed.RankReporter(distributed.rank())
        handle_stop_signals(reporter, is_trainer(job))
        watch_launcher()
        return execute(job, reporter)[1]
    with open_pipes() as pipes:
        reporter = PipesReporter(pipes)
        handle_stop_signals(reporter, is_trainer(job))
        watch_launcher()
        with system_metrics.sampling(reporter.metrics, INTERVAL_S if is_trainer(job) else 0):
            outcome, code = execute(job, reporter)
        reporter.send(outcome, status_file)
    return code


def finish(code: int) -> NoReturn:
    """Leave the worker process with code (a fresh interpreter's and a forked one's way out alike)."""
    if code == EXIT_CANCELLED:  # do not wait for threads a stopped job left blocked (a call to a hung server)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    finish(main())
