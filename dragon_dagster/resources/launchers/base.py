"""What every launcher shares: the protocol, the Pipes tap that takes the worker's own messages (step metrics,
the outcome) off whatever channel carries them, and how a launcher tells that the Dagster run is gone.

A launcher starts `python -m dragon_dagster.engine.runtime.worker <job>` somewhere (launchers/subprocess.py: a
child process; ray.py: a Ray job; k8s.py: a Kubernetes pod), connects it to the run through Dagster Pipes, and
returns its exit code. The training resource picks one by name (launchers/__init__.py's LAUNCHERS).
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import socket
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ClassVar, Literal, Protocol

import psutil
from dagster import DagsterRunStatus, PipesMessageReader, PreviewWarning
from dagster._core.storage.tags import HIDDEN_TAG_PREFIX

from ...engine.config.reporter import STEP_RECORD_ATTR, StepProgress

logger = logging.getLogger(__name__)

ENDED = (DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED, DagsterRunStatus.SUCCESS)
# A run tag per step, ".dagster/dragon-worker.<step key>": where that step's worker runs, as its launcher describes
# it ({"launcher": "subprocess", "host": ..., "pid": ...}), read by the instance's run launcher (run_launcher.py)
# when the run's own processes are gone. Bookkeeping, not something to read: under Dagster's hidden-tag prefix, which
# its UI and GraphQL leave out of a run's tags (a JSON per step would bury the run's own tags).
WORKER_TAG = f"{HIDDEN_TAG_PREFIX}dragon-worker."
WorkerState = Literal["running", "gone", "unknown"]


class Launcher(Protocol):
    """Runs a worker command for a Dagster step and returns its exit code (0: it reported a result)."""

    name: ClassVar[str]

    def launch(self, context, resource, command: list[str], env: dict[str, str], tap: PipesTap, parallel: bool) -> int:
        """resource: the TrainingResource asking (its launcher settings: ray_address, k8s, cpus_per_worker, ...)."""
        ...

    @staticmethod
    def worker_state(where: dict) -> WorkerState:
        """Whether the worker a record_worker tag describes still runs; unknown when it cannot be seen from here
        (another host, an unreachable cluster)."""
        ...

    @staticmethod
    def stop_worker(where: dict) -> str:
        """Ask that worker to stop (a trainer saves a checkpoint first); what was done, in a few words."""
        ...


def record_worker(context, launcher: str, **where) -> None:
    """Tag the step's run with where its worker runs, so that a run whose Dagster processes all died (a crash, an
    out-of-memory kill, a reboot) can be told from one still training, and its worker stopped."""
    try:
        step = str(context.op_execution_context.node_handle)  # the step key of an unmapped op
        context.instance.add_run_tags(
            context.op_execution_context.run_id, {WORKER_TAG + step: json.dumps({"launcher": launcher, **where})}
        )
    except Exception as exc:  # noqa: BLE001 - never fails the launch: the worker runs regardless, unwatched
        context.log.warning(f"could not record where the worker runs: {exc}")


def recorded_workers(tags: dict[str, str]) -> dict[str, dict]:
    """step key -> the record_worker description, from a run's tags (a malformed one is skipped)."""
    found = {}
    for key, value in tags.items():
        if key.startswith(WORKER_TAG):
            try:
                found[key.removeprefix(WORKER_TAG)] = json.loads(value)
            except ValueError:
                continue
    return found


def this_host() -> str:
    return socket.gethostname()


def process_started(pid: int) -> float | None:
    """When the process pid started (epoch seconds), None when there is none."""
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return None


def local_process_state(host: str | None, pid: int, started: float | None, slack_s: float = 2.0) -> WorkerState:
    """Whether process pid, started at `started` on `host`, still runs. A pid taken by a newer process (after a
    reboot, or the pids wrapped) counts as gone: its process started later than the one recorded."""
    if host and host != this_host():
        return "unknown"
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return "gone"
        if started is not None and process.create_time() > started + slack_s:
            return "gone"
    except psutil.Error:  # no such process (or it ended while being asked)
        return "gone"
    return "running"


def _run_record(context):
    """The step's run as Dagster's storage has it; None when the storage does not answer (a database restarting):
    a status check that cannot be made is not a reason to stop the work it watches."""
    try:
        return context.instance.get_run_by_id(context.op_execution_context.run_id)
    except Exception as exc:  # noqa: BLE001 - any storage error means "unknown"; the next check asks again
        logger.warning("could not read run %s's status (%s); going on", context.op_execution_context.run_id, exc)
        return None


class RunProcess:
    """The process that runs this step's Dagster run, watched from the step.

    A step of the multiprocess executor is a multiprocessing child of the run process, whichever start method
    made it: multiprocessing's own parent sentinel ends when the run process does. The step's parent pid is not
    that sign under the pool executor's forkserver, whose steps are the forkserver's children and which lives on
    while any step holds its pipe. A step run in the run process itself (the in-process executor) watches its
    parent pid instead.
    """

    def __init__(self):
        self._parent = multiprocessing.parent_process()
        self._ppid = os.getppid()

    def died(self) -> bool:
        if self._parent is not None and not self._parent.is_alive():
            return True
        return os.getppid() != self._ppid


def run_gone(context, run_process: RunProcess) -> str | None:
    """Why the step's Dagster run can no longer record this work, or None while it can (or while Dagster's
    storage cannot say: a database outage does not stop a training)."""
    if run_process.died():  # nothing will mark the run, so do it here
        run = _run_record(context)
        if run is not None and run.status not in ENDED:
            try:
                context.instance.report_run_failed(run, "the run's process died while a worker was running")
            except Exception as exc:  # noqa: BLE001 - the worker is stopped either way; run monitoring marks it
                logger.warning("could not mark run %s failed: %s", context.op_execution_context.run_id, exc)
        return f"the process of Dagster run {context.op_execution_context.run_id} died"
    run = _run_record(context)
    if run is not None and run.status in ENDED:
        return f"Dagster run {context.op_execution_context.run_id} has ended ({run.status.value})"
    return None


class PipesTap:
    """Takes the worker's own custom Pipes messages off the channel, whichever reader carries it (a temp
    file, a Ray job's log, a pod's log): step metrics go to on_metrics as they arrive, a training step's line
    goes to the step's log (the Dagster run's event log) with its StepProgress on the record, for the terminal's
    progress bar (assets/console_log.py); the outcome (result or error) is kept. Everything else goes on to
    Dagster's handler.

    Metrics are a view of the run, not its result: one that fails to log is reported once and skipped, and
    never fails or blocks the training it describes.
    """

    def __init__(
        self,
        on_metrics: Callable[[int, dict], None] | None = None,
        warn: Callable[[str], None] = print,
        log: logging.Logger | None = None,
    ):
        self.on_metrics, self.warn, self.log = on_metrics, warn, log
        self.outcome: dict = {}
        self.failures = 0

    def wrap(self, reader: PipesMessageReader) -> PipesMessageReader:
        return _TappedReader(reader, self)

    def take(self, message: dict) -> bool:
        """True when message was the worker's own (metrics or outcome) and has been dealt with here."""
        if message.get("method") != "report_custom_message":
            return False
        payload = (message.get("params") or {}).get("payload")
        if not isinstance(payload, dict) or payload.get("kind") not in ("metrics", "outcome", "step"):
            return False
        if payload["kind"] == "outcome":
            self.outcome = {k: v for k, v in payload.items() if k != "kind"}
        elif payload["kind"] == "step":
            progress = StepProgress(int(payload["done"]), int(payload["total"]), str(payload["line"]))
            if self.log is None:
                print(progress.line, flush=True)
            else:
                self.log.info(progress.line, extra={STEP_RECORD_ATTR: progress})
        elif self.on_metrics is not None:
            try:
                self.on_metrics(int(payload["step"]), dict(payload["values"]))
            except Exception as exc:  # noqa: BLE001 - see the class docstring
                self.failures += 1
                if self.failures == 1:
                    self.warn(
                        f"could not forward step metrics to tracking ({type(exc).__name__}: {exc}); "
                        "training goes on, the metrics stay in the artifact's progress.jsonl"
                    )
        return True


class _TappedHandler:
    """Dagster's message handler, with the tap in front of handle_message."""

    def __init__(self, handler, tap: PipesTap):
        self._handler, self._tap = handler, tap

    def handle_message(self, message) -> None:
        if not self._tap.take(message):
            self._handler.handle_message(message)

    def __getattr__(self, name):
        return getattr(self._handler, name)


class _TappedReader(PipesMessageReader):
    """A message reader that hands its messages to a PipesTap first; all else is the wrapped reader's."""

    def __init__(self, reader: PipesMessageReader, tap: PipesTap):
        self.reader, self.tap = reader, tap

    @contextmanager
    def read_messages(self, handler) -> Iterator[dict]:
        with self.reader.read_messages(_TappedHandler(handler, self.tap)) as params:
            yield params

    def on_opened(self, opened_payload) -> None:
        self.reader.on_opened(opened_payload)

    def on_launched(self, launched_payload) -> None:
        self.reader.on_launched(launched_payload)

    def messages_are_readable(self, params) -> bool:
        readable = getattr(self.reader, "messages_are_readable", None)
        return readable(params) if readable else True

    @property
    def expected_writer_count(self) -> int:
        # Dagster's session asks every reader for this (a preview API): passing the question on to the wrapped
        # reader is not a use of the preview feature of our own, so its PreviewWarning is not ours to show
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PreviewWarning)
            return self.reader.expected_writer_count

    def no_messages_debug_text(self) -> str:
        return self.reader.no_messages_debug_text()
