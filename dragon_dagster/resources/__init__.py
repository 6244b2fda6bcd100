"""Dagster resources, swapped per environment: artifact storage, MLflow tracking, training (GPU)."""

from .storage import ArtifactStore
from .tracking import MLflowTracking
from .training import TrainingResource

__all__ = ["ArtifactStore", "MLflowTracking", "TrainingResource"]
