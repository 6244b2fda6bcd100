"""The training resource: where and how trainers run (device, dtype, 4-bit, launcher).

Each job runs in a child process launched through Dagster Pipes: GPU memory is freed when it exits, its
log lines stream into the Dagster run, and terminating the run forwards SIGINT so the trainer saves a
checkpoint and stops. Another launcher (Kubernetes, Ray) would ship the same job file and the same
`python -m dragon_dagster.engine.worker` command through the matching Pipes client.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Literal

from dagster import ConfigurableResource, Failure, PipesSubprocessClient
from dagster._core.errors import DagsterPipesExecutionError
from pydantic import Field

from ..engine.settings import Hardware


class TrainingResource(ConfigurableResource):
    """Runs training, merge and evaluation jobs in a child process on the configured device."""

    device: Literal["auto", "cuda", "mps", "cpu"] = Field(default="auto", description="Where to train.")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        default="auto", description="auto: bfloat16 on GPUs that support it, float32 on CPU/MPS.")
    load_in_4bit: bool = Field(default=False, description="QLoRA: load the base model in 4-bit (CUDA only).")
    launcher: Literal["subprocess"] = Field(default="subprocess", description="How the worker is started.")
    python: str = Field(default="", description="Python interpreter for the worker. Empty: this one.")
    termination_timeout_s: float = Field(default=600, description="How long a cancelled trainer may take "
                                                                   "to save its checkpoint.")

    def hardware(self) -> dict:
        return Hardware(self.device, self.dtype, self.load_in_4bit).validate().__dict__

    def run_job(self, context, job: dict, workdir: Path, env: dict[str, str] | None = None) -> dict:
        """Write the job file into workdir (it stays with the artifact), run the worker, return its result."""
        job = {**job, "hardware": self.hardware()}
        job_file = Path(workdir) / "job.json"
        job_file.write_text(json.dumps({k: v for k, v in job.items() if k != "tracking"}, indent=2))
        run_file = Path(workdir) / ".job-run.json"  # with tracking details; removed after the run
        run_file.write_text(json.dumps(job))
        status_file = Path(workdir) / "status.json"
        client = PipesSubprocessClient(termination_timeout_seconds=self.termination_timeout_s)
        command = [self.python or sys.executable, "-m", "dragon_dagster.engine.worker", str(run_file)]
        try:
            client.run(context=context, command=command, env=env or {})
        except DagsterPipesExecutionError as exc:
            status = _read_status(status_file)
            raise Failure(description=status.get("error") or f"{exc}: see the run's stdout for the traceback") from exc
        finally:
            run_file.unlink(missing_ok=True)
        status = _read_status(status_file)
        status_file.unlink(missing_ok=True)
        if status.get("event") != "result":
            raise Failure(description=f"the {job['kind']} worker finished without a result")
        return status["result"]


def _read_status(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
