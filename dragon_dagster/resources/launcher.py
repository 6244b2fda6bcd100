"""The training resource: where and how trainers run (device, dtype, 4-bit, launcher).

Each job runs in a child process launched through Dagster Pipes: GPU memory is freed when it exits, its
log lines stream into the Dagster run, and terminating the run forwards SIGINT so the trainer saves a
checkpoint and stops. Another launcher (Kubernetes, Ray) would ship the same job file and the same
`python -m dragon_dagster.engine.worker` command through the matching Pipes client.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from dagster import ConfigurableResource, Failure, PipesSubprocessClient
from dagster._core.errors import DagsterPipesExecutionError
from pydantic import Field

from ..engine.spec.registry import KINDS
from ..engine.spec.settings import Hardware, Speed


class TrainingResource(ConfigurableResource):
    """Runs training, merge and evaluation jobs in a child process on the configured device."""

    device: Literal["auto", "cuda", "mps", "cpu"] = Field(default="auto", description="Where to train.")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        default="auto", description="auto: bfloat16 on GPUs that support it, float32 on CPU/MPS.")
    load_in_4bit: bool = Field(default=False, description="QLoRA: load the base model in 4-bit (CUDA only).")
    packing: Literal["auto", "on", "off"] = Field(
        default="auto", description="SFT: pack rows into max_seq_len rows, each sequence attending only to itself. "
                                    "auto: on for CUDA (fills the GPU), off elsewhere (a step keeps batch_size rows).")
    loss_kernel: Literal["auto", "chunked", "trl"] = Field(
        default="auto", description="SFT loss head. chunked: projects only trained positions, gradient formed in "
                                    "forward; trl: TRL's fused head (Triton on GPUs). auto: trl on CUDA, else chunked.")
    generation_batch_size: int = Field(
        default=0, description="GRPO: completions sampled per generation round, reused over several optimizer "
                               "steps (TRL generation_batch_size). 0: one step's worth.")
    torch_compile: bool = Field(default=False, description="Compile the model with torch.compile before training.")
    launcher: Literal["subprocess"] = Field(default="subprocess", description="How the worker is started.")
    python: str = Field(default="", description="Python interpreter for the worker. Empty: this one.")
    termination_timeout_s: float = Field(default=600, description="How long a cancelled trainer may take "
                                                                   "to save its checkpoint.")

    def hardware(self) -> dict:
        return Hardware(self.device, self.dtype, self.load_in_4bit).validate().__dict__

    def speed(self) -> dict:
        return Speed(self.packing, self.loss_kernel, self.generation_batch_size or None,
                     self.torch_compile).validate().__dict__

    def run_job(self, context, job: dict, workdir: Path, env: dict[str, str] | None = None,
                on_metrics: Callable[[int, dict], None] | None = None) -> dict:
        """Write the job file into workdir (it stays with the artifact), run the worker, return its result.

        on_metrics(step, values) gets the worker's step metrics while it runs (the stages log them to MLflow).
        """
        kind = job["settings"]["kind"]
        job = {**job, "hardware": self.hardware()}
        if KINDS[kind].role == "training":
            job["speed"] = self.speed()
        job_file = Path(workdir) / "job.json"
        job_file.write_text(json.dumps(job, indent=2))
        run_file = Path(workdir) / ".job-run.json"  # with the metrics stream; removed after the run
        stream = Path(workdir) / ".metrics-stream.jsonl"
        run_file.write_text(json.dumps({**job, "metrics_stream": str(stream) if on_metrics else None}))
        status_file = Path(workdir) / "status.json"
        client = PipesSubprocessClient(termination_timeout_seconds=self.termination_timeout_s)
        command = [self.python or sys.executable, "-m", "dragon_dagster.engine.worker", str(run_file)]
        forwarder = MetricsForwarder(stream, on_metrics, warn=context.log.warning) if on_metrics else None
        try:
            client.run(context=context, command=command, env=env or {})
        except DagsterPipesExecutionError as exc:
            status = _read_status(status_file)
            raise Failure(description=status.get("error") or f"{exc}: see the run's stdout for the traceback") from exc
        finally:
            if forwarder:
                forwarder.close()
            run_file.unlink(missing_ok=True)
            stream.unlink(missing_ok=True)
        status = _read_status(status_file)
        status_file.unlink(missing_ok=True)
        if status.get("event") != "result":
            raise Failure(description=f"the {kind} worker finished without a result")
        return status["result"]


class MetricsForwarder:
    """Follows the worker's metrics stream on a thread and hands each whole line to a callback, then drains it.

    Metrics are a view of the run, not its result: a line that fails to parse or to log is reported once and
    skipped, and never fails or blocks the training it describes.
    """

    def __init__(self, path: Path, on_metrics: Callable[[int, dict], None], interval_s: float = 1.0,
                 warn: Callable[[str], None] = print):
        self.path, self.on_metrics, self.interval_s, self.warn = path, on_metrics, interval_s, warn
        self.offset, self.failures = 0, 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._follow, daemon=True, name="metrics-forwarder")
        self.thread.start()

    def _follow(self) -> None:
        while not self.done.wait(self.interval_s):
            self.forward()

    def forward(self) -> None:
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except OSError:
            return
        for line in chunk.splitlines(keepends=True):
            if not line.endswith(b"\n"):
                break  # still being written: the next pass takes it whole
            self.offset += len(line)
            try:
                record = json.loads(line)
                self.on_metrics(record["step"], record["values"])
            except Exception as exc:  # noqa: BLE001 - see the class docstring
                self.failures += 1
                if self.failures == 1:
                    self.warn(f"could not forward step metrics to tracking ({type(exc).__name__}: {exc}); "
                              "training goes on, the metrics stay in the artifact's progress.jsonl")

    def close(self, timeout_s: float = 30) -> None:
        self.done.set()
        self.thread.join(timeout_s)
        if not self.thread.is_alive():
            self.forward()


def _read_status(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
