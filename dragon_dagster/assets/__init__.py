"""The thin Dagster layer: assets built from pipeline YAML, their config classes and checks."""

from .factory import build_pipeline_defs

__all__ = ["build_pipeline_defs"]
