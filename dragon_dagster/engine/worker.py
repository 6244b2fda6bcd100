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

Data parallelism (a training job with `parallel: {workers: N, backend: ...}`, see distributed.py): under
torchrun every rank runs this module; rank 0 opens Pipes, reports and writes the artifact, the others print
to stdout with a `[rank k]` prefix. With backend "ray" this process is the Ray job's driver: it starts a Ray
Train TorchTrainer whose workers run the stage, and forwards rank 0's lines and metrics (train/on_ray.py).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback
from contextlib import nullcontext
from pathlib import Path

from . import distributed, remote, system_metrics
from .reporter import Reporter
from .system_metrics import INTERVAL_S

EXIT_FAILED, EXIT_CANCELLED = 2, 3
PARENT_PID = "DRAGON_WORKER_PARENT_PID"  # set by the launcher: the watchdog compares os.getppid() with it
# (under torchrun, whose agent is the parent, it checks that this process is alive)
# Under torchrun a cancel reaches each rank twice: the launcher signals the whole process group, and the
# torchrun agent forwards the signal it got to the ranks. Repeats this close to the first are the same request.
SAME_REQUEST_S = 5.0


class StopNow(BaseException):
    """Raised by the signal handler in a job that has no checkpoint to save: it stops where it is."""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
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
        self.pipes.report_custom_message(
            {"kind": "metrics", "step": int(step), "values": {k: float(v) for k, v in values.items()}}
        )

    def send(self, payload: dict, status_file: Path | None) -> None:
        """The outcome, as a Pipes message and as a file beside a local job (readable even after a crash exit)."""
        try:
            if status_file is not None:
                status_file.write_text(json.dumps(payload, default=str))
        except OSError:  # a read-only job folder: the Pipes message is what counts there
            pass
        if self.pipes is not None:
            self.pipes.report_custom_message(json.loads(json.dumps({"kind": "outcome", **payload}, default=str)))


def load_job(job: dict):
    """(job, run function) from a job file's mapping: the stage settings validated by their kind's model."""
    from .spec.registry import kind_of, parse_stage

    job = dict(job)
    job.pop("parallel", None)  # how the job is spread over workers; the ranks read theirs from the environment
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


def execute(job: dict, reporter: Reporter) -> tuple[dict, int]:
    """Run the job: (the outcome to report, the exit code). A failure is reported as a clean message; its
    traceback goes to stdout."""
    try:
        # a job shipped through the artifact store: inputs fetched to this node, the output uploaded by rank 0
        with remote.localized(job, artifact_cache(), publish=distributed.is_main()) as local_job:
            result = run_job(local_job, reporter)
    except (Exception, StopNow) as exc:
        from .train.trainer import Cancelled

        traceback.print_exc()
        cancelled = isinstance(exc, (Cancelled, StopNow))
        return (
            {"event": "cancelled" if cancelled else "error", "error": f"{type(exc).__name__}: {exc}"},
            EXIT_CANCELLED if cancelled else EXIT_FAILED,
        )
    return {"event": "result", "result": result}, 0


def handle_stop_signals(reporter: Reporter, trainer: bool) -> None:
    """SIGINT/SIGTERM: a trainer saves a checkpoint and stops at the end of its step, a second signal (not the
    torchrun agent's forward of the first) stops at once; any other job stops at once."""
    first: list[float] = []
    repeats_are_one = distributed.under_torchrun()

    def request_stop(signum, frame):
        if not trainer:
            raise StopNow(f"stopped on signal {signum}")
        if reporter.stop_requested:
            if repeats_are_one and time.monotonic() - first[0] < SAME_REQUEST_S:
                return
            raise StopNow(f"stopped on signal {signum}")
        first.append(time.monotonic())
        reporter.stop_requested = True
        reporter.log(f"received signal {signum}: saving a checkpoint and stopping at the end of this step")

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)


def watch_launcher() -> None:
    if os.environ.get(PARENT_PID):
        watch_parent(int(os.environ[PARENT_PID]), grandparent=distributed.under_torchrun())


def open_pipes():
    """Dagster Pipes when the launcher set it up (rank 0 only: one writer per channel), else nothing."""
    if os.environ.get("DAGSTER_PIPES_CONTEXT"):
        from dagster_pipes import open_dagster_pipes

        return open_dagster_pipes()
    return nullcontext(None)


def artifact_cache() -> Path:
    """Where this node keeps the artifacts its jobs fetched from an artifact store (immutable: fetched once)."""
    return Path(os.environ.get("DRAGON_ARTIFACT_CACHE") or Path.home() / ".cache" / "dragon-dagster")


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
    job, status_file = read_job(argv[0])
    parallel = distributed.Parallel.from_job(job)
    if parallel is not None and parallel.backend == "ray":  # the driver; the ranks run on_ray.rank_loop
        from .train import on_ray

        return on_ray.drive(job, parallel, status_file)
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


if __name__ == "__main__":
    code = main()
    if code == EXIT_CANCELLED:  # do not wait for threads a stopped job left blocked (a call to a hung server)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
