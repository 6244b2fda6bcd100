"""Running one job in this process: parse it through its kind's Job model, run its worker function, and say how
it ended (a result, an error with its message, or a cancel). worker.py (a child process, a pod, a Ray job's driver)
and ray_driver.py (each Ray Train rank) both run jobs through here.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import time
import traceback
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from .. import catalog
from ..config.job import Job
from ..config.kind import StageKind
from ..config.reporter import Reporter, StepProgress
from ..train import distributed
from . import remote

EXIT_FAILED, EXIT_CANCELLED = 2, 3
# Under torchrun a cancel reaches each rank twice: the launcher signals the whole process group, and the
# torchrun agent forwards the signal it got to the ranks. Repeats this close to the first are the same request.
SAME_REQUEST_S = 5.0


class JobError(ValueError):
    """A job file that is not a job this worker can run (malformed, foreign, an unknown kind)."""


class StopNow(BaseException):
    """Raised by the signal handler in a job that has no checkpoint to save: it stops where it is."""


class PipesReporter(Reporter):
    """Log lines, training steps and step metrics go through Pipes (steps and metrics as custom messages
    `{"kind": "step" | "metrics", ...}`); the parent logs the metrics to MLflow and each step's line to the run's
    log, with how far the trainer is (the terminal's progress bar).

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

    def step(self, progress: StepProgress) -> None:
        """The step's line with how far the trainer is, as one message: the parent logs the line with it."""
        if self.pipes is None:
            print(progress.line, flush=True)
        else:
            self.pipes.report_custom_message(
                {"kind": "step", "done": progress.done, "total": progress.total, "line": progress.line}
            )

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


def open_pipes():
    """Dagster Pipes when the launcher set it up (rank 0 only: one writer per channel), else nothing."""
    if os.environ.get("DAGSTER_PIPES_CONTEXT"):
        from dagster_pipes import open_dagster_pipes

        from .pipes_lines import WholeLineMessageWriter

        return open_dagster_pipes(message_writer=WholeLineMessageWriter())
    return nullcontext(None)


def artifact_cache() -> Path:
    """Where this node keeps the artifacts its jobs fetched from an artifact store (immutable: fetched once)."""
    return Path(os.environ.get("DRAGON_ARTIFACT_CACHE") or Path.home() / ".cache" / "dragon-dagster")


def kind_of_job(job: dict[str, Any]) -> StageKind:
    """The kind a job's mapping names; a kind registered outside this package is found through its module."""
    if not isinstance(job, dict) or not isinstance(job.get("settings"), dict):
        raise JobError("not a dragon-dagster job: no settings mapping")
    if job.get("kind_module"):
        importlib.import_module(job["kind_module"])  # registers the kind in this process
    settings = catalog.upgraded(job["settings"])
    try:
        return catalog.get(settings.get("kind"))
    except ValueError as exc:
        raise JobError(str(exc)) from None


def load_job(job: dict[str, Any]) -> tuple[Job, Any]:
    """(the typed job, its worker function) from a job file's mapping, every field checked by the kind's Job."""
    kind = kind_of_job(job)
    try:
        typed = kind.job_model().model_validate({**job, "settings": catalog.upgraded(job["settings"])})
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:5])
        raise JobError(f"not a valid {kind.name} job: {problems}") from None
    return typed, kind.load_worker()


def is_trainer(job: dict[str, Any]) -> bool:
    """Trainers save a checkpoint before they stop; other jobs have nothing to save."""
    try:
        return kind_of_job(job).role == "training"
    except JobError:
        return False


def execute(job: dict[str, Any], reporter: Reporter) -> tuple[dict, int]:
    """Run the job: (the outcome to report, the exit code). A failure is reported as a clean message; its
    traceback goes to stdout."""
    try:
        typed, run = load_job(job)
        # a job shipped through the artifact store: inputs fetched to this node, the output uploaded by rank 0
        with remote.localized(typed, artifact_cache(), publish=distributed.is_main()) as local_job:
            result = run(local_job, reporter)
    except (Exception, StopNow) as exc:
        from ..train.trainer import Cancelled

        traceback.print_exc()
        cancelled = isinstance(exc, (Cancelled, StopNow))
        return (
            {"event": "cancelled" if cancelled else "error", "error": f"{type(exc).__name__}: {exc}"},
            EXIT_CANCELLED if cancelled else EXIT_FAILED,
        )
    return {"event": "result", "result": None if result is None else result.model_dump(mode="json")}, 0


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
