"""The training resource: where and how jobs run (device, dtype, 4-bit, speed, launcher, workers).

Its hardware and speed fields are generated from the engine's two models (engine/config/hardware.py), so each
setting is defined once, with its choices and description, for the resource, the launchpad, the job and the docs.
Each job runs in a worker launched through Dagster Pipes by the launcher the resource names (launchers/): its
log lines and step metrics stream into the Dagster run, GPU memory is freed when it exits, and terminating the
run stops it (a trainer saves a checkpoint first).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from dagster import ConfigurableResource, Failure
from pydantic import Field, create_model

from ..engine import catalog
from ..engine.config.hardware import Hardware, Speed
from ..engine.config.job import Job, Parallel, relative_paths
from ..engine.config.results import StageResult
from ..engine.runtime import remote
from .launchers import LAUNCHERS, PipesTap
from .launchers.k8s_pod import K8sPod

# The resource's fields for the two engine models, each with the model's type, default and description.
HardwareAndSpeed = create_model(
    "HardwareAndSpeed",
    __base__=ConfigurableResource,
    __doc__="The hardware and speed fields, as the engine's models define them.",
    **{name: (info.annotation, info) for model in (Hardware, Speed) for name, info in model.model_fields.items()},
)


class TrainingResource(HardwareAndSpeed):
    """Runs training, synthesis, merge, evaluation and export jobs in a worker on the configured device."""

    launcher: Literal[tuple(LAUNCHERS)] = Field(  # type: ignore[valid-type] - the names in LAUNCHERS
        default="subprocess",
        description="Where the worker runs. subprocess: a child process of the Dagster run "
        "(torchrun with workers > 1); ray: a Ray job on the cluster at "
        "ray_address (Ray Train with workers > 1); k8s: a pod (see k8s).",
    )
    workers: int = Field(
        default=1,
        ge=1,
        description="Data-parallel processes that train one stage, gradients "
        "synchronised. A stage's batch_size stays the global batch.",
    )
    cpus_per_worker: float = Field(default=1.0, gt=0, description="CPUs each worker asks for (ray, k8s).")
    gpus_per_worker: float = Field(
        default=-1, description="GPUs each worker asks for (ray, k8s). -1: one when device is cuda, else none."
    )
    memory_gb_per_worker: float = Field(
        default=0, ge=0, description="Memory each worker asks for (ray, k8s); 0: no request."
    )
    ray_address: str = Field(
        default="", description="Ray dashboard address, e.g. http://head:8265. Empty: $RAY_ADDRESS."
    )
    ray_runtime_env: dict[str, Any] = Field(
        default_factory=dict,
        description="Ray runtime_env for the job (pip, env_vars, ...). Visible in the Ray "
        "dashboard: keep secrets in the cluster's environment, not here.",
    )
    k8s: K8sPod = Field(
        default_factory=K8sPod,
        description="The pod a k8s worker runs in: image, namespace, volumes, node selector, secrets.",
    )
    python: str = Field(
        default="",
        description="Python interpreter for the worker. Empty: this one for "
        "subprocess, `python` on the PATH of a Ray node or pod.",
    )
    warm_start: bool = Field(
        default=True,
        description="subprocess launcher: fork each single-process worker from a warm process that has imported "
        "torch, transformers, TRL and PEFT once (seconds less per job). A job whose environment differs from "
        "that process's (thread counts, HF_* settings), torchrun and another interpreter start cold, and the "
        "step's log says which. False: a fresh interpreter for every job.",
    )
    termination_timeout_s: float = Field(
        default=600, description="How long a cancelled trainer may take to save its checkpoint before it is killed."
    )

    def hardware(self) -> Hardware:
        return Hardware(**{name: getattr(self, name) for name in Hardware.model_fields})

    def speed(self) -> Speed:
        return Speed(**{name: getattr(self, name) for name in Speed.model_fields})

    def run_job(
        self,
        context,
        job: Job,
        workdir: Path,
        env: dict[str, str] | None = None,
        on_metrics: Callable[[int, dict], None] | None = None,
        store=None,
        final: Path | None = None,
    ) -> StageResult:
        """Write the job file into workdir (it stays with the artifact), run the worker, return its result as the
        kind's result model.

        The resource adds how the job runs: hardware for every job; speed and, with several workers, parallel for
        training jobs; the module of the kind, so a worker finds a kind registered outside this package.
        on_metrics(step, values) gets the worker's step metrics while it runs (the stages log them to MLflow);
        they arrive as Pipes messages, whichever launcher ran the worker. With a store that has an
        artifact_uri (and final, the artifact workdir becomes), the job goes through the store: the worker
        fetches its inputs from there and uploads its output, which is collected back into workdir.
        """
        kind = catalog.get(job.settings.kind)
        training = kind.role == "training"
        job = job.model_copy(
            update={
                "hardware": self.hardware(),
                "speed": self.speed() if training else None,
                "parallel": self.parallel() if training and self.workers > 1 else None,
                "kind_module": kind.module,
            }
        )
        job_file = Path(workdir) / "job.json"  # stays with the artifact: its own paths relative to it
        job_file.write_text(relative_paths(job, workdir).model_dump_json(indent=2))
        run_file = Path(workdir) / RUN_FILE  # absolute paths (or URIs); removed after the run
        run_file.write_text(job.model_dump_json())
        status_file = Path(workdir) / "status.json"
        tap = PipesTap(on_metrics, warn=context.log.warning, log=context.log)
        output_uri = (
            store.staging_uri(final, context.op_execution_context.run_id) if store and store.artifact_uri else None
        )
        try:
            shipped = ship(job, workdir, store, output_uri) if output_uri else None
            launcher = LAUNCHERS[self.launcher]()
            command = self.command(shipped or str(run_file), job)
            returncode = launcher.launch(context, self, command, env or {}, tap, parallel=job.parallel is not None)
            if shipped and returncode == 0 and tap.outcome.get("event") == "result":
                remote.collect(output_uri, workdir)
        finally:
            if output_uri:  # also after a half-done upload of the inputs
                remote.discard(output_uri)
            run_file.unlink(missing_ok=True)
        status = tap.outcome or _read_status(status_file)
        status_file.unlink(missing_ok=True)
        if returncode != 0 or status.get("event") != "result":
            raise Failure(
                description=status.get("error")
                or (
                    f"the {kind.name} worker ({self.launcher}) exited with code {returncode}: see the run's log for "
                    "the traceback"
                    if returncode
                    else f"the {kind.name} worker finished without a result"
                )
            )
        return kind.result.model_validate(status["result"])

    def command(self, job_source: str, job: Job) -> list[str]:
        """The worker's command line for the job file (a path, or a URI in the artifact store)."""
        # on a cluster, the interpreter on the nodes' PATH: this process's path means nothing there
        python = self.python or ("python" if self.launcher != "subprocess" else sys.executable)
        if job.parallel is None or job.parallel.backend != "torchrun":
            return [python, "-m", WORKER_MODULE, job_source]
        # torchrun forwards a terminate to the ranks and kills them after its shutdown timeout (30 s by default):
        # about as long as the resource gives, to finish the step and save the checkpoint, but before the
        # resource kills the agent's group, which does not hold the ranks (they run in sessions of their own)
        shutdown_s = max(5, int(self.termination_timeout_s) - 10)
        return [
            python,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={self.workers}",
            f"--shutdown-timeout={shutdown_s}",
            "-m",
            WORKER_MODULE,
            job_source,
        ]

    def parallel(self) -> Parallel:
        """How the worker spreads one training stage over `workers` processes (runtime/worker.py reads it)."""
        return Parallel(
            workers=self.workers,
            backend="ray" if self.launcher == "ray" else "torchrun",
            cpus_per_worker=self.cpus_per_worker,
            gpus_per_worker=self.gpus(),
            memory_gb_per_worker=self.memory_gb_per_worker,
        )

    def gpus(self) -> float:
        if self.gpus_per_worker >= 0:
            return self.gpus_per_worker
        return 1.0 if self.device == "cuda" else 0.0


WORKER_MODULE = "dragon_dagster.engine.runtime.worker"
RUN_FILE = ".job-run.json"


def ship(job: Job, workdir: Path, store, out: str) -> str:
    """Put the job where a worker on any node reads it, under out in the store's artifact_uri: what the parent
    wrote into workdir (data, rewards), then the job itself with URIs for paths. Returns the job's URI."""
    remote.push_inputs(workdir, out)
    shipped = remote.remote_job(job, store.root, store.artifact_uri, out)
    fs, path = remote.filesystem(out)
    with fs.open(remote.join(path, RUN_FILE), "w") as f:  # collect brings it back into workdir: removed there
        f.write(shipped.model_dump_json())
    return remote.join(out, RUN_FILE)


def _read_status(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
