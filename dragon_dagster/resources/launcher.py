"""The training resource: where and how trainers run (device, dtype, 4-bit, launcher).

Each job runs in a child process launched through Dagster Pipes: GPU memory is freed when it exits and its
log lines stream into the Dagster run. The worker runs in a process group of its own, so stopping it stops
everything it started (a reward command, say):
- terminating the Dagster run sends SIGTERM: a trainer saves a checkpoint and stops, other jobs stop at once;
  a worker still running after termination_timeout_s is killed, group and all;
- a step whose Dagster run has ended or whose run process died stops its worker the same way, and the worker
  itself stops when the step process is gone (engine/worker.py's watchdog), so none trains on under PID 1.
Another launcher (Kubernetes, Ray) would ship the same job file and the same
`python -m dragon_dagster.engine.worker` command through the matching Pipes client.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from dagster import (
    ConfigurableResource,
    DagsterRunStatus,
    Failure,
    PipesMessageReader,
    PipesTempFileContextInjector,
    PipesTempFileMessageReader,
    open_pipes_session,
)
from pydantic import Field

from ..engine import remote
from ..engine.spec.registry import KINDS
from ..engine.spec.settings import Hardware, Speed
from ..engine.worker import PARENT_PID
from .k8s_pod import K8sPod

ENDED = (DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED, DagsterRunStatus.SUCCESS)


class TrainingResource(ConfigurableResource):
    """Runs training, merge and evaluation jobs in a child process on the configured device."""

    device: Literal["auto", "cuda", "mps", "cpu"] = Field(default="auto", description="Where to train.")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        default="auto", description="auto: bfloat16 on GPUs that support it, float32 on CPU/MPS."
    )
    load_in_4bit: bool = Field(default=False, description="QLoRA: load the base model in 4-bit (CUDA only).")
    packing: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="SFT: pack rows into max_seq_len rows, each sequence attending only to itself. "
        "auto: on for CUDA (fills the GPU), off elsewhere (a step keeps batch_size rows).",
    )
    loss_kernel: Literal["auto", "chunked", "trl"] = Field(
        default="auto",
        description="SFT loss head. chunked: projects only trained positions, gradient formed in "
        "forward; trl: TRL's fused head (Triton on GPUs). auto: trl on CUDA, else chunked.",
    )
    generation_batch_size: int = Field(
        default=0,
        description="GRPO: completions sampled per generation round, reused over several optimizer "
        "steps (TRL generation_batch_size). 0: one step's worth.",
    )
    torch_compile: bool = Field(default=False, description="Compile the model with torch.compile before training.")
    unpad: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="With the chunked head, run the model over the real tokens of a batch only, "
        "each row attending to itself. auto: on except for CUDA.",
    )
    dropout_mask: Literal["auto", "fast", "torch"] = Field(
        default="auto",
        description="LoRA dropout masks: fast draws 16 bits per element (CPU), torch one 32-bit "
        "number. auto: fast except for CUDA.",
    )
    sampling: Literal["auto", "grouped", "trl"] = Field(
        default="auto",
        description="GRPO sampling. grouped: each prompt's forward pass once for its group, and "
        "no LoRA dropout while sampling; trl: TRL's generate as is. auto: grouped.",
    )
    launcher: Literal["subprocess", "ray", "k8s"] = Field(
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
    termination_timeout_s: float = Field(
        default=600, description="How long a cancelled trainer may take to save its checkpoint before it is killed."
    )

    def hardware(self) -> dict:
        return Hardware(self.device, self.dtype, self.load_in_4bit).validate().__dict__

    def speed(self) -> dict:
        return (
            Speed(
                self.packing,
                self.loss_kernel,
                self.generation_batch_size or None,
                self.torch_compile,
                self.unpad,
                self.dropout_mask,
                self.sampling,
            )
            .validate()
            .__dict__
        )

    def run_job(
        self,
        context,
        job: dict,
        workdir: Path,
        env: dict[str, str] | None = None,
        on_metrics: Callable[[int, dict], None] | None = None,
        store=None,
        final: Path | None = None,
    ) -> dict:
        """Write the job file into workdir (it stays with the artifact), run the worker, return its result.

        on_metrics(step, values) gets the worker's step metrics while it runs (the stages log them to MLflow);
        they arrive as Pipes messages, whichever launcher ran the worker. With a store that has an
        artifact_uri (and final, the artifact workdir becomes), the job goes through the store: the worker
        fetches its inputs from there and uploads its output, which is collected back into workdir.
        """
        kind = job["settings"]["kind"]
        job = {**job, "hardware": self.hardware()}
        if KINDS[kind].role == "training":
            job["speed"] = self.speed()
            if self.workers > 1:
                job["parallel"] = self.parallel()
        job_file = Path(workdir) / "job.json"  # stays with the artifact: its own paths relative to it
        job_file.write_text(json.dumps(portable_job(job, workdir), indent=2))
        run_file = Path(workdir) / RUN_FILE  # absolute paths (or URIs); removed after the run
        run_file.write_text(json.dumps(job))
        status_file = Path(workdir) / "status.json"
        tap = PipesTap(on_metrics, warn=context.log.warning)
        output_uri = store.staging_uri(final, context.run_id) if store and store.artifact_uri else None
        try:
            shipped = ship(job, workdir, store, output_uri) if output_uri else None
            returncode = self._launch(
                context, self.command(shipped or str(run_file), job), env or {}, tap, parallel=bool(job.get("parallel"))
            )
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
                    f"the {kind} worker ({self.launcher}) exited with code {returncode}: see the run's log for the "
                    "traceback"
                    if returncode
                    else f"the {kind} worker finished without a result"
                )
            )
        return status["result"]

    def command(self, job_source: str, job: dict) -> list[str]:
        """The worker's command line for the job file (a path, or a URI in the artifact store)."""
        # on a cluster, the interpreter on the nodes' PATH: this process's path means nothing there
        python = self.python or ("python" if self.launcher != "subprocess" else sys.executable)
        if job.get("parallel", {}).get("backend") != "torchrun":
            return [python, "-m", "dragon_dagster.engine.worker", job_source]
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
            "dragon_dagster.engine.worker",
            job_source,
        ]

    def parallel(self) -> dict:
        """How the worker spreads one training stage over `workers` processes (engine/worker.py reads it)."""
        return {
            "workers": self.workers,
            "backend": "ray" if self.launcher == "ray" else "torchrun",
            "cpus_per_worker": self.cpus_per_worker,
            "gpus_per_worker": self.gpus(),
            "memory_gb_per_worker": self.memory_gb_per_worker,
        }

    def gpus(self) -> float:
        if self.gpus_per_worker >= 0:
            return self.gpus_per_worker
        return 1.0 if self.device == "cuda" else 0.0

    def _launch(self, context, command: list[str], env: dict[str, str], tap: PipesTap, parallel: bool) -> int:
        if self.launcher == "ray":
            from .ray_job import run_ray_job

            parent = os.getppid()
            return run_ray_job(
                context,
                address=self.ray_address,
                command=command,
                env=env,
                wrap_reader=tap.wrap,
                runtime_env=self.ray_runtime_env,
                stop_wait_s=self.termination_timeout_s,
                # with workers > 1 the driver only coordinates: the Ray Train workers hold the resources
                cpus=0 if parallel else self.cpus_per_worker,
                gpus=0 if parallel else self.gpus(),
                memory_gb=0 if parallel else self.memory_gb_per_worker,
                gone=lambda: run_gone(context, parent),
            )
        if self.launcher == "k8s":
            from .k8s_pod import run_pod

            n = self.workers if parallel else 1  # torchrun runs the ranks inside the one pod
            return run_pod(
                context,
                self.k8s,
                command,
                env,
                tap.wrap,
                cpus=self.cpus_per_worker * n,
                gpus=self.gpus() * n,
                memory_gb=self.memory_gb_per_worker * n,
                termination_grace_s=self.termination_timeout_s,
            )
        return self._run_worker(context, command, env, tap)

    def _run_worker(self, context, command: list[str], env: dict[str, str], tap: PipesTap) -> int:
        with open_pipes_session(
            context=context,
            context_injector=PipesTempFileContextInjector(),
            message_reader=tap.wrap(PipesTempFileMessageReader()),
        ) as session:
            # a Dagster process inside a distributed job of its own (a PyTorchJob pod, say) has RANK and the
            # like set: a worker that read them would think itself a rank; torchrun sets its ranks' own
            inherited = {k: v for k, v in os.environ.items() if k not in RANK_VARIABLES}
            proc = subprocess.Popen(
                command,
                start_new_session=True,  # its own process group: see the docstring
                env={**inherited, **env, **session.get_bootstrap_env_vars(), PARENT_PID: str(os.getpid())},
            )
            try:
                return self._wait(context, proc)
            except BaseException:  # the run was terminated (Dagster raises an interrupt here), or it is gone
                stop_process_group(proc, self.termination_timeout_s, context.log)
                raise

    def _wait(self, context, proc: subprocess.Popen, poll_s: float = 2.0) -> int:
        """The worker's exit code; raises if the Dagster run ends or its process dies while the worker runs."""
        parent = os.getppid()
        while True:
            try:
                return proc.wait(timeout=poll_s)
            except subprocess.TimeoutExpired:
                pass
            gone = run_gone(context, parent)
            if gone:
                raise Failure(description=f"{gone}: stopped the worker (pid {proc.pid}) and its process group")


RUN_FILE = ".job-run.json"
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


def ship(job: dict, workdir: Path, store, out: str) -> str:
    """Put the job where a worker on any node reads it, under out in the store's artifact_uri: what the parent
    wrote into workdir (data, rewards), then the job itself with URIs for paths. Returns the job's URI."""
    remote.push_inputs(workdir, out)
    shipped = remote.remote_job(job, store.root, store.artifact_uri, out)
    fs, path = remote.filesystem(out)
    with fs.open(remote.join(path, RUN_FILE), "w") as f:  # collect brings it back into workdir: removed there
        json.dump(shipped, f)
    return remote.join(out, RUN_FILE)


# Job fields that may name a path inside the staging dir (the artifact's directory under its temporary name).
PATH_FIELDS = ("output_dir", "train_file", "eval_file", "prompts_file", "checkpoint_dir", "resume_from", "merged_model")


def portable_job(job: dict, workdir: Path) -> dict:
    """The job as job.json keeps it: paths inside workdir relative to it ("." for workdir itself).

    workdir is the artifact's staging dir, renamed when the artifact is complete, so an absolute path into it
    would name a directory that no longer exists; `resolve_job(job, artifact_dir)` turns them back."""
    root = Path(workdir).resolve()
    out = dict(job)
    for name in PATH_FIELDS:
        value = out.get(name)
        if isinstance(value, str) and Path(value).is_absolute():
            try:
                out[name] = Path(value).resolve().relative_to(root).as_posix() or "."
            except ValueError:  # outside the artifact (an upstream artifact, the checkpoints): kept absolute
                pass
    return out


def resolve_job(job: dict, artifact_dir: str | Path) -> dict:
    """A job.json read back from an artifact, with its relative paths made absolute against artifact_dir:
    what the worker (engine/worker.py `load_job`, `python -m dragon_dagster.engine.worker`) reads."""
    root = Path(artifact_dir).resolve()
    out = dict(job)
    for name in PATH_FIELDS:
        value = out.get(name)
        if isinstance(value, str) and not Path(value).is_absolute():
            out[name] = str(root / value) if value != "." else str(root)
    return out


def run_gone(context, parent_pid: int) -> str | None:
    """Why the step's Dagster run can no longer record this work, or None while it can."""
    run = context.instance.get_run_by_id(context.run_id)
    if os.getppid() != parent_pid:  # the run process was killed: nothing will mark the run, so do it here
        if run is not None and run.status not in ENDED:
            context.instance.report_run_failed(run, "the run's process died while a worker was running")
        return f"the process of Dagster run {context.run_id} died"
    if run is not None and run.status in ENDED:
        return f"Dagster run {context.run_id} has ended ({run.status.value})"
    return None


def stop_process_group(proc: subprocess.Popen, timeout_s: float, log) -> None:
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


class PipesTap:
    """Takes the worker's own custom Pipes messages off the channel, whichever reader carries it (a temp
    file, a Ray job's log, a pod's log): step metrics go to on_metrics as they arrive, the outcome (result or
    error) is kept. Everything else goes on to Dagster's handler.

    Metrics are a view of the run, not its result: one that fails to log is reported once and skipped, and
    never fails or blocks the training it describes.
    """

    def __init__(self, on_metrics: Callable[[int, dict], None] | None = None, warn: Callable[[str], None] = print):
        self.on_metrics, self.warn = on_metrics, warn
        self.outcome: dict = {}
        self.failures = 0

    def wrap(self, reader: PipesMessageReader) -> PipesMessageReader:
        return _TappedReader(reader, self)

    def take(self, message: dict) -> bool:
        """True when message was the worker's own (metrics or outcome) and has been dealt with here."""
        if message.get("method") != "report_custom_message":
            return False
        payload = (message.get("params") or {}).get("payload")
        if not isinstance(payload, dict) or payload.get("kind") not in ("metrics", "outcome"):
            return False
        if payload["kind"] == "outcome":
            self.outcome = {k: v for k, v in payload.items() if k != "kind"}
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
        return self.reader.expected_writer_count

    def no_messages_debug_text(self) -> str:
        return self.reader.no_messages_debug_text()


def _read_status(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
