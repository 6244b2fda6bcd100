"""A pipeline as its YAML says it: the model of the whole (definition.py), how it is read (loading.py), its problems
described by field and line (errors.py), its schema for `dg check yaml` (schema.py), its data checked before
training (preflight.py) and its retraining from chat feedback (retraining.py)."""

from .definition import Pipeline, PipelineError
from .errors import describe
from .loading import load, parse

__all__ = ["Pipeline", "PipelineError", "describe", "load", "parse"]
