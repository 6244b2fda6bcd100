"""A data-parallel training job on a Ray cluster: this process is the Ray job's driver, Ray Train runs the ranks.

The launcher submits `python -m dragon_dagster.engine.runtime.worker JOB.json` as a Ray job; the worker sees
`parallel.backend == "ray"` and calls drive(). The driver opens Dagster Pipes (it is the only writer of the
job's channel) and starts a Ray Train TorchTrainer with one worker actor per rank; each runs rank_loop, the
same stage function a torchrun rank runs (Ray Train sets up the torch process group and the torchrun-style
variables RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT that transformers' Trainer reads).

Rank 0 is a worker actor, not the driver, so a small actor, the Channel, carries between them: rank 0's log
lines and step metrics (the driver drains them on a thread and sends them through its Pipes reporter), the
outcome, and the driver's stop request (rank 0 polls it at the end of each step; the ranks agree on it with
an all-reduce). Stopping the Ray job signals the driver; it asks the ranks to checkpoint and stop, waits, and
reports the cancel. The ranks are actors of this job, so they end with the driver whatever happens to it.
"""

from __future__ import annotations

import shutil
import signal
import tempfile
import threading
import traceback
from pathlib import Path

from ..config.job import Parallel
from ..config.reporter import Reporter, StepProgress
from ..train import distributed

POLL_S = 0.2  # how often the driver drains the channel and passes a stop request on


class Channel:
    """Between the driver and rank 0 (a Ray actor): lines and metrics one way, the stop request the other."""

    def __init__(self):
        self.items: list[tuple[str, object]] = []
        self.stop = False
        self.outcome: dict | None = None

    def put(self, kind: str, payload) -> None:
        self.items.append((kind, payload))

    def take(self) -> list[tuple[str, object]]:
        items, self.items = self.items, []
        return items

    def request_stop(self) -> None:
        self.stop = True

    def stop_requested(self) -> bool:
        return self.stop

    def finish(self, outcome: dict) -> None:
        self.outcome = outcome

    def result(self) -> dict | None:
        return self.outcome


class ChannelReporter(Reporter):
    """Rank 0 on Ray: lines and metrics go to the driver through the channel; a stop is the driver's request."""

    def __init__(self, channel):
        super().__init__()
        self.channel = channel

    def log(self, message: str) -> None:
        self.channel.put.remote("log", message)

    def step(self, progress: StepProgress) -> None:
        self.channel.put.remote("step", progress)

    def metrics(self, step: int, values: dict[str, float]) -> None:
        if values:
            self.channel.put.remote("metrics", {"step": int(step), "values": {k: float(v) for k, v in values.items()}})

    def should_stop(self) -> bool:
        import ray

        if not self.stop_requested:
            self.stop_requested = ray.get(self.channel.stop_requested.remote())
        return self.stop_requested


def rank_loop(config: dict) -> None:
    """One Ray Train worker: run the stage as a torchrun rank would; rank 0 reports through the channel.

    A failed rank raises after rank 0 has sent the outcome: Ray Train then ends the whole group (the others
    would wait in their next collective until its timeout) and, with no retries, fit() raises on the driver.
    A cancel ends every rank normally, at the same step."""
    from .execution import EXIT_FAILED, execute

    channel = config["channel"]
    rank = distributed.rank()
    reporter = ChannelReporter(channel) if rank == 0 else distributed.RankReporter(rank)
    outcome, code = execute(config["job"], reporter)
    if rank == 0:
        import ray

        ray.get(channel.finish.remote(outcome))
    if code == EXIT_FAILED:
        raise RuntimeError(f"rank {rank}: {outcome['error']}")


def scaling(parallel: Parallel):
    from ray.train import ScalingConfig

    resources = {"CPU": parallel.cpus_per_worker}
    if parallel.gpus_per_worker > 0:
        resources["GPU"] = parallel.gpus_per_worker
    if parallel.memory_gb_per_worker > 0:
        resources["memory"] = int(parallel.memory_gb_per_worker * 2**30)
    return ScalingConfig(
        num_workers=parallel.workers, use_gpu=parallel.gpus_per_worker > 0, resources_per_worker=resources
    )


def drain(channel, reporter: Reporter, done: threading.Event) -> None:
    """Until done: send rank 0's lines and metrics through the driver's reporter, pass a stop request on."""
    import ray

    asked = False
    while True:
        finished = done.wait(POLL_S)
        if reporter.stop_requested and not asked:
            ray.get(channel.request_stop.remote())
            asked = True
        for kind, payload in ray.get(channel.take.remote()):
            if kind == "log":
                reporter.log(payload)
            elif kind == "step":
                reporter.step(payload)
            else:
                reporter.metrics(payload["step"], payload["values"])
        if finished:
            return


def drive(job: dict, parallel: Parallel, status_file: Path) -> int:
    """The Ray job's driver: start the ranks, relay what rank 0 says, report the outcome; the exit code."""
    from .execution import EXIT_CANCELLED, EXIT_FAILED, PipesReporter, StopNow, open_pipes

    with open_pipes() as pipes:
        reporter = PipesReporter(pipes)
        try:
            outcome = train_on_ray(job, parallel, reporter)
        except (Exception, StopNow) as exc:
            traceback.print_exc()
            stopped = isinstance(exc, StopNow)
            outcome = {"event": "cancelled" if stopped else "error", "error": f"{type(exc).__name__}: {exc}"}
        reporter.send(outcome, status_file)
    return {"result": 0, "cancelled": EXIT_CANCELLED}.get(outcome["event"], EXIT_FAILED)


def stop_on_signals(reporter: Reporter, workers: int) -> None:
    """The first SIGTERM/SIGINT (the Ray job stopped, the Dagster run cancelled) asks the ranks to save a
    checkpoint and stop; a second stops the driver at once, and the ranks with it."""
    from .execution import StopNow

    def request_stop(signum, frame):
        if reporter.stop_requested:
            raise StopNow(f"stopped on signal {signum}")
        reporter.stop_requested = True  # drain() passes it to the ranks
        reporter.log(
            f"received signal {signum}: asking the {workers} ranks to save a checkpoint "
            f"and stop at the end of this step"
        )

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)


def train_on_ray(job: dict, parallel: Parallel, reporter: Reporter) -> dict:
    """Run the ranks to the end; the outcome rank 0 reported, or an error when none did."""
    import ray
    from ray.train import FailureConfig, RunConfig
    from ray.train.torch import TorchTrainer

    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init()  # the cluster this job runs on (RAY_ADDRESS), or a local one
    stop_on_signals(reporter, parallel.workers)  # after ray.init, which sets a SIGTERM handler of its own
    storage = tempfile.mkdtemp(prefix="dragon-ray-train-")  # Ray Train's own records; ours go to checkpoint_dir
    done = threading.Event()
    try:
        channel = ray.remote(num_cpus=0)(Channel).remote()
        relay = threading.Thread(target=drain, args=(channel, reporter, done), daemon=True, name="ray-relay")
        relay.start()
        reporter.log(
            f"starting {parallel.workers} Ray Train workers ({parallel.cpus_per_worker} CPU, "
            f"{parallel.gpus_per_worker} GPU each)"
        )
        trainer = TorchTrainer(
            rank_loop,
            train_loop_config={"job": job, "channel": channel},
            scaling_config=scaling(parallel),
            run_config=RunConfig(
                name="dragon-stage", storage_path=storage, failure_config=FailureConfig(max_failures=0)
            ),
        )
        failure = None
        try:
            trainer.fit()
        except Exception as exc:  # a rank failed or died; rank 0's outcome, when it sent one, says more
            failure = exc
        finally:
            done.set()
            relay.join()
        outcome = ray.get(channel.result.remote())
        if outcome is None and failure is not None:
            raise failure
        return outcome or {"event": "error", "error": "the Ray Train workers ended without an outcome"}
    finally:
        done.set()
        shutil.rmtree(storage, ignore_errors=True)
        if started_ray:  # the job's actors (the ranks, the channel) end with it
            ray.shutdown()
