"""The instance's run launcher on a real Dagster instance (sqlite storage) and real processes: a run whose run
process is gone is FAILED by its health check (and a worker it left running is stopped), a live one is RUNNING,
a pid taken by a newer process does not pass for the run's, and Terminate cancels a dead run at once.
(tests/assets/test_webserver.py kills a whole `dagster dev` for real and watches the daemon do it.)"""

import json
import os
import subprocess
import sys
import time

import pytest
from dagster import DagsterInstance, DagsterRunStatus, EventLogEntry, job, op
from dagster._core.events import DagsterEvent, DagsterEventType, EngineEventData
from dagster._core.launcher import WorkerStatus
from dagster._core.storage.tags import GRPC_INFO_TAG, TagType, get_tag_type

from dragon_dagster.resources.launchers.base import WORKER_TAG, process_started, this_host
from dragon_dagster.resources.run_launcher import RUN_HOST_TAG, WatchedRunLauncher, check_run
from tests.support import wait_until


@op
def nothing():
    return None


@job
def training():
    nothing()


@pytest.fixture
def instance(tmp_path):
    (tmp_path / "dagster.yaml").write_text(
        "run_launcher:\n  module: dragon_dagster.resources.run_launcher\n  class: WatchedRunLauncher\n"
    )
    with DagsterInstance.from_config(str(tmp_path)) as instance:
        yield instance


def started_run(instance, pid: int, at: float | None = None, host: str | None = "this", **tags):
    """A STARTED run whose run process Dagster recorded as pid, at time `at` (now by default), with the event its
    code server logs."""
    if host:
        tags[RUN_HOST_TAG] = this_host() if host == "this" else host
    run = instance.create_run_for_job(training, status=DagsterRunStatus.STARTED, tags=tags)
    event = DagsterEvent(
        DagsterEventType.ENGINE_EVENT.value,
        job_name=run.job_name,
        message=f"Started process for run (pid: {pid}).",
        event_specific_data=EngineEventData.in_process(pid),
    )
    entry = EventLogEntry(None, level=20, user_message="", run_id=run.run_id, timestamp=at or time.time())
    instance.store_event(entry._replace(dagster_event=event))
    return instance.get_run_by_id(run.run_id)


def exited_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_the_instance_loads_the_watched_launcher_with_a_health_check(instance):
    assert isinstance(instance.run_launcher, WatchedRunLauncher)
    assert instance.run_launcher.supports_check_run_worker_health


def test_a_run_whose_process_runs_is_running(instance):
    run = started_run(instance, os.getpid())
    assert check_run(instance, run).status == WorkerStatus.RUNNING


def test_a_run_whose_process_is_gone_fails_with_a_message_saying_so(instance):
    pid = exited_pid()
    run = started_run(instance, pid)
    health = instance.run_launcher.check_run_worker_health(run)
    assert health.status == WorkerStatus.FAILED
    assert f"the run process (pid {pid} on {this_host()}) is gone" in health.msg
    assert "Dagster stopped with it" in health.msg


def test_a_pid_taken_by_a_newer_process_is_not_the_runs(instance):
    # a live pid, but recorded an hour before its process started: after a reboot pids are handed out again
    run = started_run(instance, os.getpid(), at=process_started(os.getpid()) - 3600)
    assert check_run(instance, run).status == WorkerStatus.FAILED


def test_a_run_on_another_host_is_not_judged(instance):
    run = started_run(instance, exited_pid(), host="some-other-host")
    assert check_run(instance, run).status == WorkerStatus.RUNNING


def test_a_run_launched_through_a_local_code_server_counts_as_this_hosts(instance):
    local = {GRPC_INFO_TAG: json.dumps({"host": "localhost", "port": 4000})}
    assert check_run(instance, started_run(instance, exited_pid(), host=None, **local)).status == WorkerStatus.FAILED
    remote = {GRPC_INFO_TAG: json.dumps({"host": "code-server.internal", "port": 4000})}
    assert check_run(instance, started_run(instance, exited_pid(), host=None, **remote)).status == WorkerStatus.RUNNING


def test_a_worker_left_running_by_a_dead_run_is_stopped_and_named(instance):
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    try:
        started = process_started(worker.pid)
        where = {"launcher": "subprocess", "host": this_host(), "pid": worker.pid, "started": started}
        run = started_run(instance, exited_pid(), **{WORKER_TAG + "tiny__sft_adapter": json.dumps(where)})
        # bookkeeping the UI and GraphQL leave out of the run's tags
        assert get_tag_type(WORKER_TAG + "tiny__sft_adapter") == TagType.HIDDEN
        health = check_run(instance, run)
        assert health.status == WorkerStatus.FAILED
        assert f"step tiny__sft_adapter's worker still ran: sent SIGTERM to worker {worker.pid}" in health.msg
        assert worker.wait(timeout=30) == -15
    finally:
        worker.kill()


def test_terminate_cancels_a_dead_run_at_once_without_an_error(instance):
    run = started_run(instance, exited_pid())
    assert instance.run_launcher.terminate(run.run_id) is True
    ended = instance.get_run_by_id(run.run_id)
    assert ended.status == DagsterRunStatus.CANCELED
    [canceled] = instance.all_logs(run.run_id, of_type={DagsterEventType.RUN_CANCELED})
    assert "Canceled at once: the run process" in canceled.message


def test_terminate_of_a_live_run_whose_code_server_is_gone_signals_its_process(instance):
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        run = started_run(
            instance, victim.pid, **{GRPC_INFO_TAG: json.dumps({"host": "localhost", "port": 1})}
        )  # port 1: nothing listens there
        assert instance.run_launcher.terminate(run.run_id) is True
        wait_until(lambda: victim.poll() is not None, 30, "the run process to get SIGTERM")
        assert victim.returncode == -15
        assert instance.get_run_by_id(run.run_id).status == DagsterRunStatus.CANCELING
    finally:
        victim.kill()
