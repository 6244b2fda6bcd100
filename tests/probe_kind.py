"""A stage kind that reports what its worker process sees, for the tests of where a job's settings come from
(tests/engine/runtime/test_warm_projects.py): the variables that name a project's stores, what mlflow (imported by
the warm worker, through TRL) makes of them in the worker, its working directory, umask and CPUs, and the warm
worker that forked it. It trains nothing and loads no model: a job of it takes well under a second."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from dragon_dagster.engine import catalog
from dragon_dagster.engine.config.job import Job, TrainingInputs
from dragon_dagster.engine.config.kind import StageKind
from dragon_dagster.engine.config.reporter import Reporter
from dragon_dagster.engine.config.results import TrainingResult
from dragon_dagster.engine.train.stage import TrainerStage

# What tells two projects apart: each is read by the code that writes to that store.
STORES = ("DAGSTER_HOME", "MLFLOW_TRACKING_URI", "DRAGON_RUNS_DIR", "DRAGON_FEEDBACK_URL")


class EnvironmentProbe(TrainerStage):
    """Reports what its worker process sees (a test's probe: nothing is trained)."""

    kind: Literal["environment_probe"]


class ProbeResult(TrainingResult):
    stores: dict[str, str | None]  # STORES as the worker's environment has them
    tracking_uri: str  # mlflow.get_tracking_uri() in the worker
    experiments: list[str]  # the experiments an MlflowClient made in the worker finds
    cwd: str
    start_folder: str  # multiprocessing's ORIGINAL_DIR: where a spawned child of the job resolves its paths
    umask: int
    cpus: list[int]
    warm_parent: int | None  # the warm worker that forked it (None: a fresh interpreter)


def probe(job: Job[EnvironmentProbe, TrainingInputs], reporter: Reporter) -> ProbeResult:
    import multiprocessing.process

    import mlflow

    status = Path("/proc/self/status").read_text().splitlines()
    umask = next(int(line.split()[1], 8) for line in status if line.startswith("Umask:"))
    experiments = [e.name for e in mlflow.MlflowClient().search_experiments()]
    reporter.log(f"environment probe: tracking {mlflow.get_tracking_uri()}, experiments {experiments}")
    return ProbeResult(
        objective="environment_probe",
        loss_label="no loss (a probe)",
        stores={name: os.environ.get(name) for name in STORES},
        tracking_uri=mlflow.get_tracking_uri(),
        experiments=experiments,
        cwd=os.getcwd(),
        start_folder=multiprocessing.process.ORIGINAL_DIR,
        umask=umask,
        cpus=sorted(os.sched_getaffinity(0)),
        warm_parent=int(os.environ["DRAGON_WORKER_WARM_PARENT"]) if "DRAGON_WORKER_WARM_PARENT" in os.environ else None,
    )


KIND = catalog.register(  # on import, as a plugin's: the worker imports this module (the job's kind_module)
    StageKind(
        EnvironmentProbe,
        "training",
        TrainingInputs,
        ProbeResult,
        f"{__name__}:probe",
        lambda stage: [],
        summary="Reports what its worker process sees (a test's probe).",
    )
)
