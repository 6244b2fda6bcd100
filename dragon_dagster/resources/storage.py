"""Where artifacts, checkpoints and the MLflow store live: the runs directory."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from dagster import ConfigurableResource
from pydantic import Field

from ..engine.artifacts import new_artifact_path, staged_dir


def default_runs_dir() -> Path:
    return Path(os.environ.get("DRAGON_RUNS_DIR", Path.cwd() / "runs")).resolve()


class ArtifactStore(ConfigurableResource):
    """Immutable artifact directories under a runs directory, one per materialization."""

    runs_dir: str = Field(default="", description="Root of artifacts, checkpoints and the MLflow store. "
                                                  "Empty: $DRAGON_RUNS_DIR, else ./runs.")

    @property
    def root(self) -> Path:
        return Path(self.runs_dir).resolve() if self.runs_dir else default_runs_dir()

    @contextmanager
    def new_artifact(self, pipeline: str, stage: str, run_id: str) -> Iterator[tuple[Path, Path]]:
        """(staging dir to write into, final path it becomes when the block succeeds)."""
        final = new_artifact_path(self.root / "artifacts", pipeline, stage, run_id)
        with staged_dir(final) as tmp:
            yield tmp, final

    def feedback_path(self, pipeline: str) -> Path:
        """The pipeline's chat feedback store (append-only SQLite, WAL)."""
        return self.root / "feedback" / f"{pipeline}.sqlite"

    def deployed_pointer(self, pipeline: str) -> Path:
        """Written when a retrained model passes its promotion check; chat and retraining start from it."""
        return self.root / "deployed" / f"{pipeline}.json"

    def checkpoint_dir(self, pipeline: str, stage: str, run_id: str) -> Path:
        path = self.root / "checkpoints" / pipeline / stage / run_id
        path.mkdir(parents=True, exist_ok=True)
        return path

    def latest_checkpoint(self, pipeline: str, stage: str) -> Path | None:
        """The newest checkpoint any earlier run of this stage left behind (cancelled or failed)."""
        found = list((self.root / "checkpoints" / pipeline / stage).glob("*/checkpoint-*"))
        return max(found, key=lambda p: p.stat().st_mtime, default=None)
