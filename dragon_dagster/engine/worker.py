"""Child-process entry point: `python -m dragon_dagster.engine.worker JOB.json`.

The training resource launches this through Dagster Pipes, so GPU memory is freed when it exits and the
same command can run in a container or on a cluster. It speaks only the Pipes protocol (dagster_pipes, no
dagster): log lines and a final result go back to the run; step metrics go to a stream file that the
parent forwards to MLflow as they come.

Stopping: SIGINT or SIGTERM (a terminated Dagster run) asks a trainer to save a checkpoint and stop at the end
of its step; any other job (merge, evaluation, synthesis) stops at once. The worker also dies with the
process that started it: a watchdog stops it when its parent is gone, so a killed Dagster step never leaves
a worker training under PID 1.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import traceback
from contextlib import nullcontext
from pathlib import Path

from .reporter import Reporter

EXIT_FAILED, EXIT_CANCELLED = 2, 3
PARENT_PID = "DRAGON_WORKER_PARENT_PID"  # set by the launcher; the watchdog compares os.getppid() with it


class StopNow(BaseException):
    """Raised by the signal handler in a job that has no checkpoint to save: it stops where it is."""


def watch_parent(expected: int, interval_s: float = 1.0) -> None:
    """Signal this process (SIGTERM, as a terminate would) once its parent has died: reparenting changes
    getppid. A thread, so it works wherever the worker runs; the launcher sets the pid it expects."""
    import threading
    import time

    def watch():
        while os.getppid() == expected:
            time.sleep(interval_s)
        print(f"worker: parent process {expected} is gone; stopping", flush=True)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, daemon=True, name="parent-watchdog").start()


class PipesReporter(Reporter):
    """Log lines go through Pipes; step metrics are appended to a stream file that the parent forwards to MLflow.

    The child never imports MLflow: that import and the first connection to a sqlite store cost about 4 s of
    a 2-core machine, more than the rest of what Dagster adds to a materialization.
    """

    def __init__(self, pipes=None, metrics_stream: str | None = None):
        super().__init__()
        self.pipes = pipes
        self.stream = Path(metrics_stream) if metrics_stream else None

    def log(self, message: str) -> None:
        if self.pipes is None:
            print(message, flush=True)
        else:  # the run's console logger prints it too
            self.pipes.log.info(message)

    def metrics(self, step: int, values: dict[str, float]) -> None:
        if self.stream is None or not values:
            return
        with self.stream.open("a") as f:  # one line per call, flushed on close: the parent reads whole lines
            f.write(json.dumps({"step": int(step), "values": values}, default=float) + "\n")

    def send(self, payload: dict, status_file: Path) -> None:
        """The outcome, as a Pipes message and as a file beside the job (readable even after a crash exit)."""
        status_file.write_text(json.dumps(payload, default=str))
        if self.pipes is not None:
            self.pipes.report_custom_message({k: v for k, v in payload.items() if k != "result"})


def load_job(job: dict):
    """(job, run function) from a job file's mapping: the stage settings validated by their kind's model."""
    from .spec.registry import kind_of, parse_stage

    job = dict(job)
    settings = parse_stage(job.pop("settings"))
    job_class, run = kind_of(settings).load_worker()
    return job_class(settings=settings, **job), run


def is_trainer(job: dict) -> bool:
    """Trainers save a checkpoint before they stop; other jobs have nothing to save."""
    from .spec.registry import KINDS

    kind = KINDS.get((job.get("settings") or {}).get("kind"))
    return kind is not None and kind.role == "training"


def run_job(job: dict, reporter: Reporter) -> dict:
    loaded, run = load_job(job)
    return run(loaded, reporter)


def main(argv: list[str] | None = None) -> int:
    argv = argv if argv is not None else sys.argv[1:]
    job_file = Path(argv[0])
    job = json.loads(job_file.read_text())
    status_file = job_file.parent / "status.json"
    metrics_stream = job.pop("metrics_stream", None)
    under_pipes = bool(os.environ.get("DAGSTER_PIPES_CONTEXT"))
    if under_pipes:
        from dagster_pipes import open_dagster_pipes

        pipes_cm = open_dagster_pipes()
    else:
        pipes_cm = nullcontext(None)
    with pipes_cm as pipes:
        reporter = PipesReporter(pipes, metrics_stream)

        trainer = is_trainer(job)

        def request_stop(signum, frame):
            if reporter.stop_requested or not trainer:
                raise StopNow(f"stopped on signal {signum}")
            reporter.stop_requested = True  # a second signal stops at once
            reporter.log(f"received signal {signum}: saving a checkpoint and stopping at the end of this step")

        signal.signal(signal.SIGINT, request_stop)
        signal.signal(signal.SIGTERM, request_stop)
        if os.environ.get(PARENT_PID):
            watch_parent(int(os.environ[PARENT_PID]))
        try:
            result = run_job(job, reporter)
        except (Exception, StopNow) as exc:  # reported to the parent as a clean message; traceback in stdout
            from .train.trainer import Cancelled

            traceback.print_exc()
            cancelled = isinstance(exc, (Cancelled, StopNow))
            reporter.send({"event": "cancelled" if cancelled else "error",
                           "error": f"{type(exc).__name__}: {exc}"}, status_file)
            return EXIT_CANCELLED if cancelled else EXIT_FAILED
        reporter.send({"event": "result", "result": result}, status_file)
    return 0


if __name__ == "__main__":
    code = main()
    if code == EXIT_CANCELLED:  # do not wait for threads a stopped job left blocked (a call to a hung server)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
