"""The `ray` launcher: the worker command as a Ray job on a Ray cluster, through dagster-ray's Pipes client.

The job's log is the Pipes channel (ray_logs.py's reader tails it), so log lines, step metrics and the
result reach the Dagster run as they would from a child process. Terminating the Dagster run stops the Ray job
(dagster-ray forwards the interrupt); Ray then sends SIGTERM to the job's processes and waits
RAY_JOB_STOP_WAIT_TIME_S before SIGKILL, which this launcher sets to the resource's termination timeout so a
trainer can save its checkpoint first. A watchdog thread stops the job too when the Dagster run ends or its
process dies while the job runs (what the subprocess launcher's polling does for a child).

With workers > 1 the job's driver only coordinates (engine/worker.py starts a Ray Train TorchTrainer whose
workers hold the CPUs and GPUs), so the entrypoint itself asks for no CPU: on a small cluster a driver holding
one would leave a worker unschedulable.
"""

from __future__ import annotations

import os
import shlex
import threading
import uuid
from collections.abc import Callable
from typing import ClassVar

from dagster import Failure

from .base import RunProcess, WorkerState, record_worker, run_gone
from .credentials import public_env


def submit_params(
    command: list[str],
    env: dict[str, str],
    *,
    runtime_env: dict,
    cpus: float,
    gpus: float,
    memory_gb: float,
    stop_wait_s: float,
    job_id: str,
) -> dict:
    """What JobSubmissionClient.submit_job gets (dagster-ray adds the Pipes bootstrap variables to env_vars)."""
    runtime_env = dict(runtime_env or {})
    # the dashboard shows a job's runtime env to anyone who can open it: no credentials in it
    runtime_env["env_vars"] = {
        **(runtime_env.get("env_vars") or {}),
        **public_env(env, where="ray launcher", instead="keep it in the cluster's own environment"),
        "PYTHONUNBUFFERED": "1",
        "RAY_JOB_STOP_WAIT_TIME_S": str(int(stop_wait_s)),
        # the job's log is the Pipes channel: a progress bar's carriage returns would
        # glue a message to the bar's line, where the reader no longer sees it
        "TQDM_DISABLE": "1",
    }
    if cpus >= 1:  # torch's threads: as many as the job holds (the job supervisor's environment says 1)
        runtime_env["env_vars"].setdefault("OMP_NUM_THREADS", str(int(cpus)))
    params = {
        "entrypoint": shlex.join(command),
        "runtime_env": runtime_env,
        "submission_id": job_id,
        "entrypoint_num_cpus": cpus,
    }
    if gpus:
        params["entrypoint_num_gpus"] = gpus
    if memory_gb:
        params["entrypoint_memory"] = int(memory_gb * 2**30)
    return params


def run_ray_job(
    context,
    *,
    address: str,
    command: list[str],
    env: dict[str, str],
    wrap_reader: Callable,
    runtime_env: dict,
    cpus: float,
    gpus: float,
    memory_gb: float,
    stop_wait_s: float,
    gone: Callable[[], str | None],
    extras: dict | None = None,
) -> int:
    """Run command as a Ray job and wait for it: 0 when it succeeded, 1 when it failed or was stopped.

    gone() says why the Dagster run can no longer record the work (None while it can): the job is stopped then.
    """
    from .ray_logs import WholeLineRayJobMessageReader

    client = _client_class()(
        address=address or None,
        message_reader=wrap_reader(WholeLineRayJobMessageReader()),
        forward_termination=True,
        poll_interval=0.25,
    )
    job_id = f"dragon-{context.op_execution_context.run_id[:8]}-{uuid.uuid4().hex[:6]}"
    params = submit_params(
        command,
        env,
        runtime_env=runtime_env,
        cpus=cpus,
        gpus=gpus,
        memory_gb=memory_gb,
        stop_wait_s=stop_wait_s,
        job_id=job_id,
    )
    try:
        ray_client = client.client
    except Exception as exc:  # noqa: BLE001 - any connection problem: say where we tried
        raise Failure(
            description=f"cannot reach the Ray cluster at {address or '$RAY_ADDRESS'}: {type(exc).__name__}: {exc}"
        ) from exc
    done = threading.Event()
    stopped: list[str] = []
    watchdog = threading.Thread(
        target=_watch, args=(ray_client, job_id, gone, done, stopped, context.log), daemon=True, name="ray-job-watchdog"
    )
    watchdog.start()
    record_worker(context, RayLauncher.name, address=_dashboard_address(ray_client, address), job_id=job_id)
    try:
        client.run(context=context, submit_job_params=params, extras=extras)
        return 0
    except SubmitError as exc:
        raise Failure(
            description=f"could not submit the job to the Ray cluster at {address or '$RAY_ADDRESS'}: {exc}"
        ) from exc
    except RuntimeError as exc:  # dagster-ray: the job FAILED or was STOPPED; the outcome message says why
        context.log.warning(str(exc)[-2000:])
        if stopped:
            raise Failure(description=f"{stopped[0]}: stopped Ray job {job_id}") from exc
        return 1
    except BaseException:  # an interrupt before dagster-ray watched the job, a lost dashboard, ...: no job
        _stop_unless_over(ray_client, job_id, context.log)  # may go on training with nobody to collect it
        raise
    finally:
        done.set()
        watchdog.join(5)


def _stop_unless_over(ray_client, job_id: str, log) -> None:
    try:
        if not ray_client.get_job_status(job_id).is_terminal():
            log.warning(f"stopping Ray job {job_id}")
            ray_client.stop_job(job_id)
    except Exception as exc:  # noqa: BLE001 - never submitted, or the cluster is gone: nothing to stop here
        log.warning(f"could not check or stop Ray job {job_id}: {exc}")


def _dashboard_address(ray_client, address: str) -> str:
    """The address the job was submitted to, as a later JobSubmissionClient can reach it again."""
    return getattr(ray_client, "_address", None) or address or os.environ.get("RAY_ADDRESS", "")


def _job_client(where: dict):
    from ray.job_submission import JobSubmissionClient

    return JobSubmissionClient(where["address"] or None)


class SubmitError(Exception):
    """The cluster did not take the job (nothing ran)."""


def _client_class():
    """dagster-ray's Pipes client, retrying a submission the cluster is not ready for yet: a head that has just
    started answers "No available agent to submit job" for a few seconds."""
    import time

    from dagster_ray import PipesRayJobClient

    class RetryingSubmit(PipesRayJobClient):
        def _start(self, context, session, submit_job_params, ready_within_s: float = 60) -> str:
            deadline = time.monotonic() + ready_within_s
            while True:
                try:
                    return super()._start(context, session, submit_job_params)
                except Exception as exc:  # noqa: BLE001 - nothing was submitted: say why, retry only "not ready"
                    if "No available agent" not in str(exc) or time.monotonic() > deadline:
                        raise SubmitError(f"{type(exc).__name__}: {exc}") from exc
                    time.sleep(1)

    return RetryingSubmit


def _watch(
    ray_client,
    job_id: str,
    gone: Callable[[], str | None],
    done: threading.Event,
    stopped: list[str],
    log,
    interval_s: float = 2.0,
) -> None:
    while not done.wait(interval_s):
        reason = gone()
        if reason:
            log.warning(f"{reason}: stopping Ray job {job_id}")
            stopped.append(reason)
            try:
                ray_client.stop_job(job_id)
            except Exception as exc:  # noqa: BLE001 - the job may not exist yet or be over already
                log.warning(f"could not stop Ray job {job_id}: {exc}")
            return


class RayLauncher:
    """The worker as a Ray job on the cluster at the resource's ray_address (Ray Train for workers > 1)."""

    name: ClassVar[str] = "ray"

    @staticmethod
    def worker_state(where: dict) -> WorkerState:
        try:
            return "gone" if _job_client(where).get_job_status(where["job_id"]).is_terminal() else "running"
        except Exception:  # noqa: BLE001 - the cluster is unreachable (or forgot the job): cannot tell
            return "unknown"

    @staticmethod
    def stop_worker(where: dict) -> str:
        _job_client(where).stop_job(where["job_id"])
        return f"stopped Ray job {where['job_id']} at {where['address']}"

    def launch(self, context, resource, command: list[str], env: dict[str, str], tap, parallel: bool) -> int:
        run_process = RunProcess()
        return run_ray_job(
            context,
            address=resource.ray_address,
            command=command,
            env=env,
            wrap_reader=tap.wrap,
            runtime_env=resource.ray_runtime_env,
            stop_wait_s=resource.termination_timeout_s,
            # with workers > 1 the driver only coordinates: the Ray Train workers hold the resources
            cpus=0 if parallel else resource.cpus_per_worker,
            gpus=0 if parallel else resource.gpus(),
            memory_gb=0 if parallel else resource.memory_gb_per_worker,
            gone=lambda: run_gone(context, run_process),
        )
