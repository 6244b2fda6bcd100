"""Child-process entry point: `python -m dragon_dagster.engine.worker JOB.json`.

The training resource launches this through Dagster Pipes, so GPU memory is freed when it exits and the
same command can run in a container or on a cluster. It speaks only the Pipes protocol (dagster_pipes, no
dagster): log lines, step metrics and the final result go back to the run as Pipes messages, through whatever
channel the launcher chose (a temp file for a child process, the job's log for Ray, the pod's log for
Kubernetes), so a worker on another node reports exactly as a local one; the parent logs the metrics to MLflow
as they come. The outcome is also written to status.json beside the job, readable after a crash exit.

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
    """Log lines and step metrics go through Pipes (custom messages `{"kind": "metrics", ...}`); the parent
    logs the metrics to MLflow.

    The child never imports MLflow: that import and the first connection to a sqlite store cost about 4 s of
    a 2-core machine, more than the rest of what Dagster adds to a materialization.
    """

    def __init__(self, pipes=None):
        super().__init__()
        self.pipes = pipes

    def log(self, message: str) -> None:
        if self.pipes is None:
            print(message, flush=True)
        else:  # the run's console logger prints it too
            self.pipes.log.info(message)

    def metrics(self, step: int, values: dict[str, float]) -> None:
        if self.pipes is None or not values:
            return
        self.pipes.report_custom_message({"kind": "metrics", "step": int(step),
                                          "values": {k: float(v) for k, v in values.items()}})

    def send(self, payload: dict, status_file: Path) -> None:
        """The outcome, as a Pipes message and as a file beside the job (readable even after a crash exit)."""
        try:
            status_file.write_text(json.dumps(payload, default=str))
        except OSError:  # a read-only or remote job folder: the Pipes message is what counts there
            pass
        if self.pipes is not None:
            self.pipes.report_custom_message(json.loads(json.dumps({"kind": "outcome", **payload}, default=str)))


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
    under_pipes = bool(os.environ.get("DAGSTER_PIPES_CONTEXT"))
    if under_pipes:
        from dagster_pipes import open_dagster_pipes

        pipes_cm = open_dagster_pipes()
    else:
        pipes_cm = nullcontext(None)
    with pipes_cm as pipes:
        reporter = PipesReporter(pipes)

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
