"""The life of a stage's MLflow runs, in one place: the pipeline run (mlflow_runs.pipeline_run) set running while
the stage works, the stage's own runs opened nested under it with their prompt and data linked, and every one of
them ended with the block that opened it: FINISHED, FAILED with the error, KILLED when cancelled
(MLflowTracking.owning). Training, merge and evaluation stages open their runs through it and nothing else."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..engine.pipeline import Pipeline
from .mlflow_runs import pipeline_run, stage_source
from .prompts import link_prompt


@dataclass(frozen=True)
class StageRuns:
    """A stage at work, as MLflow sees it: the pipeline run it set running (`parent`), and what opens its own
    runs under that one."""

    context: Any
    pipeline: Pipeline
    tracking: Any
    parent: str

    @contextmanager
    def open(
        self,
        name: str,
        tags: dict,
        params: dict,
        description: str,
        *,
        start_time: float | None = None,
        prompt: str | None = None,
        dataset: str | None = None,
    ) -> Iterator[str]:
        """A run nested under the pipeline run, owned by the block: yields its id. start_time: when the work it
        records began, if before now (MLflowTracking.start_run). prompt: the prompts:/ URI of the system prompt it
        used, linked on its page. dataset: the dataset artifact it trained on, whose split files become its
        dataset inputs."""
        with self.tracking.started(
            self.pipeline.name,
            name,
            tags,
            params,
            parent=self.parent,
            description=description,
            source=stage_source(self.context),
            start_time=start_time,
        ) as run_id:
            self.context.log.info(f"MLflow run {run_id}: {self.tracking.run_url(self.pipeline.name, run_id)}")
            link_prompt(self.tracking, run_id, prompt)
            if dataset is not None:
                data = Path(dataset)
                splits = {"training": data / "train.jsonl", "evaluation": data / "eval.jsonl"}
                self.tracking.log_datasets(run_id, data, data.parent.name, splits)
            yield run_id


@contextmanager
def stage_runs(context, pipeline: Pipeline, tracking, stage: str) -> Iterator[StageRuns]:
    """The pipeline run of this Dagster run (found or made), set running for the block and ended with it; the
    Dagster run's next stage sets it running again. Its error names `stage`, since the pipeline run outlives it."""
    parent = pipeline_run(context, pipeline, tracking)
    with tracking.owning(parent, where=stage):
        yield StageRuns(context, pipeline, tracking, parent)


@dataclass(frozen=True)
class StageRun:
    """A stage's one MLflow run (`id`) and the pipeline run it nests under (`parent`)."""

    id: str
    parent: str


@contextmanager
def stage_run(
    context,
    pipeline: Pipeline,
    tracking,
    stage: str,
    tags: dict,
    params: dict,
    description: str,
    *,
    prompt: str | None = None,
    dataset: str | None = None,
) -> Iterator[StageRun]:
    """The run of a stage that makes one (training, merge), named after the stage, and the pipeline run it nests
    under: both owned by the block (stage_runs, StageRuns.open)."""
    with (
        stage_runs(context, pipeline, tracking, stage) as runs,
        runs.open(stage, tags, params, description, prompt=prompt, dataset=dataset) as run_id,
    ):
        yield StageRun(id=run_id, parent=runs.parent)
