"""The merge kind's worker: release/merge.py on the chain the job names, into the artifact's model/."""

from __future__ import annotations

from pathlib import Path

from ...artifacts.manifest import MergeResult
from ...config.job import Job, ModelInputs
from ...config.reporter import Reporter
from ...release.merge import merge_adapters
from .settings import Merge

MergeJob = Job[Merge, ModelInputs]


def merge_chain(job: MergeJob, reporter: Reporter) -> MergeResult:
    return merge_adapters(
        job.inputs.model,
        job.inputs.adapters,
        Path(job.output_dir) / "model",
        job.hardware,
        job.settings.sample_prompt,
        reporter,
    )
