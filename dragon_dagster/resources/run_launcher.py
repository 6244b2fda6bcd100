"""The Dagster instance's run launcher (dagster.yaml's `run_launcher`): Dagster's default one, plus a health check
of each run's worker, so that a run whose processes all died is ended without an operator.

Why: when the whole Dagster process tree dies at once (an out-of-memory kill, a crash, a reboot), nothing is left
to mark its runs. The default launcher has no health check, so run monitoring would leave such a run STARTED for
ever, and with it the `training` pool it holds; a plain Terminate would ask the code server that started the run,
which is gone, and fail. With this launcher, run monitoring (the daemon, every poll_interval_seconds) asks:

- is the run worker process that Dagster recorded ("Started process for run (pid: N)") still running on this
  host, the same process and not a newer one that took its pid? Then the run is alive.
- if it is gone: does any worker the run's steps launched still run (each launcher records its own, as a run
  tag: a local process, a Ray job, a Kubernetes pod; launchers/base.py's record_worker)? Such a worker can no
  longer report to anyone: it is asked to stop (a trainer saves its checkpoint), and said so.

Then the run is marked failed with a message that says what was found, and its pool slot is freed as for any
ended run. Terminate of such a run cancels it at once instead of asking the dead code server. A run worker on
another host than the daemon's cannot be seen from here: it counts as running.
"""

from __future__ import annotations

import json
import os
import signal

from dagster import DagsterEventType, DagsterRun, DefaultRunLauncher
from dagster._core.launcher import CheckRunHealthResult, WorkerStatus  # the launcher API's own types
from dagster._core.storage.tags import GRPC_INFO_TAG

from .launchers import LAUNCHERS
from .launchers.base import local_process_state, recorded_workers, this_host

# The host whose processes a run's pids name: the daemon that launched it, when its code server is local.
RUN_HOST_TAG = "dragon/run_host"
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1", "")
STARTED_PROCESS = "Started process for run (pid: "


class WatchedRunLauncher(DefaultRunLauncher):
    """DefaultRunLauncher whose runs run monitoring can check: a run whose processes are gone is failed."""

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def launch_run(self, context) -> None:
        super().launch_run(context)
        run = self._instance.get_run_by_id(context.dagster_run.run_id)
        host = run_host(run.tags) if run else None
        if host:
            self._instance.add_run_tags(run.run_id, {RUN_HOST_TAG: host})

    def check_run_worker_health(self, run: DagsterRun) -> CheckRunHealthResult:
        return check_run(self._instance, run)

    def terminate(self, run_id: str) -> bool:
        """Cancel at once a run whose processes are gone; otherwise Dagster's way (through the code server), and
        if that server is gone too, a signal to the run process itself. Never raises: a Terminate answered with a
        server error helps nobody."""
        run = self._instance.get_run_by_id(run_id)
        if run is None or run.is_finished:
            return False
        health = check_run(self._instance, run)
        if health.status == WorkerStatus.FAILED:
            self._instance.report_run_canceling(run)
            self._instance.report_run_canceled(run, f"Canceled at once: {health.msg}")
            return True
        try:
            return super().terminate(run_id)
        except Exception as exc:  # noqa: BLE001 - the code server that started the run is unreachable
            return self._signal_run_process(run, exc)

    def _signal_run_process(self, run: DagsterRun, why: Exception) -> bool:
        pid, started = run_process(self._instance, run)
        host = run_host(run.tags)
        if pid is None or host is None or local_process_state(host, pid, started) != "running":
            self._instance.report_engine_event(f"Could not terminate the run: {why}", run, cls=type(self))
            return False
        os.kill(pid, signal.SIGTERM)  # Dagster's run worker takes it as an interrupt: its steps are terminated
        self._instance.report_engine_event(
            f"The code server that started this run is unreachable ({type(why).__name__}): sent SIGTERM to the "
            f"run process {pid} instead",
            run,
            cls=type(self),
        )
        return True


def run_host(tags: dict[str, str]) -> str | None:
    """The host of the run's processes: recorded at launch, else this one when the code server that started the
    run listened on a local address (as `dagster dev`'s does); None when it is not known."""
    if RUN_HOST_TAG in tags:
        return tags[RUN_HOST_TAG]
    try:
        grpc_host = json.loads(tags.get(GRPC_INFO_TAG, "{}")).get("host", "")
    except ValueError:
        return None
    return this_host() if GRPC_INFO_TAG in tags and (grpc_host in LOCAL_HOSTS or grpc_host == this_host()) else None


def run_process(instance, run: DagsterRun) -> tuple[int | None, float | None]:
    """(pid, when it started) of the run's newest run worker, from Dagster's own "Started process" event."""
    records = instance.get_records_for_run(
        run.run_id, of_type=DagsterEventType.ENGINE_EVENT, ascending=False, limit=1000
    ).records
    for record in records:
        entry = record.event_log_entry
        if entry.dagster_event and entry.dagster_event.message and STARTED_PROCESS in entry.dagster_event.message:
            pid = entry.dagster_event.engine_event_data.metadata.get("pid")
            if pid is not None:
                return int(pid.value), entry.timestamp
    return None, None


def check_run(instance, run: DagsterRun) -> CheckRunHealthResult:
    """RUNNING while the run's worker process runs (or cannot be seen from here), FAILED once it and every worker
    its steps launched are gone; a worker left running without its run is asked to stop."""
    pid, started = run_process(instance, run)
    if pid is None:
        return CheckRunHealthResult(WorkerStatus.RUNNING, "no run process recorded yet")
    host = run_host(run.tags)
    if host is None:
        return CheckRunHealthResult(WorkerStatus.RUNNING, "its code server is on another host: not checked")
    state = local_process_state(host, pid, started)
    if state != "gone":
        return CheckRunHealthResult(WorkerStatus.RUNNING, f"run process {pid} on {host}: {state}")
    found = [f"the run process (pid {pid} on {host}) is gone"]
    for step, where in recorded_workers(run.tags).items():
        launcher = LAUNCHERS.get(where.get("launcher", ""))
        if launcher is None:
            continue
        worker_state = launcher.worker_state(where)
        if worker_state == "running":
            try:
                found.append(f"step {step}'s worker still ran: {launcher.stop_worker(where)}")
            except Exception as exc:  # noqa: BLE001 - say so; the run is over either way
                found.append(f"step {step}'s worker still ran and could not be stopped: {exc}")
        elif worker_state == "unknown":
            found.append(f"step {step}'s {where['launcher']} worker could not be checked")
    return CheckRunHealthResult(
        WorkerStatus.FAILED,
        "; ".join(found) + ". Dagster stopped with it (killed, out of memory or a reboot), so nothing else would "
        "end this run",
    )
