"""The `subprocess` launcher: the worker as a child process of the Dagster step, in a process group of its own, so
stopping it stops everything it started (a reward command, say):
- terminating the Dagster run sends SIGTERM: a trainer saves a checkpoint and stops, other jobs stop at once;
  a worker still running after termination_timeout_s is killed, group and all;
- a step whose Dagster run has ended or whose run process died stops its worker the same way, and the worker
  itself stops when the step process is gone (runtime/worker.py's watchdog), so none trains on under PID 1.
With workers > 1 the command is torchrun's, which starts the ranks. A single worker is forked by the warm worker
(engine/runtime/warm/) where the job fits it (TrainingResource.warm_start), else started as a fresh interpreter;
the step's log says which.
"""

from __future__ import annotations

import os
import signal
import subprocess
from typing import ClassVar

from dagster import Failure, open_pipes_session

from ...engine.runtime.warm import client as warm
from ...engine.runtime.worker import PARENT_PID
from .base import (
    PipesTap,
    RunProcess,
    WorkerState,
    local_process_state,
    process_started,
    record_worker,
    run_gone,
    this_host,
)
from .pipes_files import StepPipesFiles

RANK_VARIABLES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
)


class SubprocessLauncher:
    name: ClassVar[str] = "subprocess"

    def launch(self, context, resource, command: list[str], env: dict[str, str], tap: PipesTap, parallel: bool) -> int:
        pipes = StepPipesFiles(context)  # in a folder of the run's, which the cleanup finds if this step is killed
        with open_pipes_session(
            context=context, context_injector=pipes.injector, message_reader=tap.wrap(pipes.reader)
        ) as session:
            # a Dagster process inside a distributed job of its own (a PyTorchJob pod, say) has RANK and the
            # like set: a worker that read them would think itself a rank; torchrun sets its ranks' own
            inherited = {k: v for k, v in os.environ.items() if k not in RANK_VARIABLES}
            proc, how = warm.start(  # its own process group either way: see the module's docstring
                command,
                {**inherited, **env, **session.get_bootstrap_env_vars(), PARENT_PID: str(os.getpid())},
                warm=resource.warm_start and not parallel,
            )
            context.log.info(f"worker {proc.pid}: {how}")
            record_worker(context, self.name, host=this_host(), pid=proc.pid, started=process_started(proc.pid))
            try:
                return self.wait(context, proc)
            except BaseException:  # the run was terminated (Dagster raises an interrupt here), or it is gone
                stop_process_group(proc, resource.termination_timeout_s, context.log)
                raise

    @staticmethod
    def worker_state(where: dict) -> WorkerState:
        return local_process_state(where.get("host"), int(where["pid"]), where.get("started"))

    @staticmethod
    def stop_worker(where: dict) -> str:
        """SIGTERM to the worker's process group (a trainer saves its checkpoint and exits; its own watchdog
        would stop it within seconds of its step process dying anyway)."""
        if SubprocessLauncher.worker_state(where) != "running":
            return f"worker {where['pid']} had stopped"
        _signal_group(int(where["pid"]), signal.SIGTERM)
        return f"sent SIGTERM to worker {where['pid']} and its process group"

    def wait(self, context, proc: subprocess.Popen | warm.WarmProcess, poll_s: float = 2.0) -> int:
        """The worker's exit code; raises if the Dagster run ends or its process dies while the worker runs."""
        run_process = RunProcess()
        while True:
            try:
                return proc.wait(timeout=poll_s)
            except subprocess.TimeoutExpired:
                pass
            gone = run_gone(context, run_process)
            if gone:
                raise Failure(description=f"{gone}: stopped the worker (pid {proc.pid}) and its process group")


def stop_process_group(proc: subprocess.Popen | warm.WarmProcess, timeout_s: float, log) -> None:
    """SIGTERM to the worker's group (a trainer saves a checkpoint), SIGKILL to all of it after timeout_s."""
    if proc.poll() is not None:
        return
    log.info(f"stopping worker {proc.pid}: SIGTERM, then SIGKILL after {timeout_s:.0f} s")
    _signal_group(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        log.warning(f"worker {proc.pid} did not stop within {timeout_s:.0f} s: killing its process group")
    _signal_group(proc.pid, signal.SIGKILL)  # also whatever the worker started and left behind
    proc.wait()


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
