"""Dagster resources, swapped per environment: artifact storage, MLflow tracking, training (GPU)."""

from .storage import ArtifactStore
from .tracking import MLflowTracking
from .training import TrainingResource


def default_resources() -> dict:
    """What every pipeline's assets need, configured from the environment (DRAGON_RUNS_DIR and defaults)."""
    return {"store": ArtifactStore(), "tracking": MLflowTracking(), "training": TrainingResource()}


__all__ = ["ArtifactStore", "MLflowTracking", "TrainingResource", "default_resources"]
