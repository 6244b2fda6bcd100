"""What every stage's asset is wired with: its key (prefixed by the pipeline's name), its group, its upstream
assets as inputs, those inputs as local directories, and bad input turned into a Failure that names it."""

from contextlib import contextmanager

from dagster import AssetIn, AssetKey, Failure

from ..engine import models
from ..engine.config.stage import Stage
from ..engine.data import errors
from ..engine.pipeline import Pipeline
from ..resources import ArtifactStore

USER_ERRORS = (errors.DataError, models.ModelError, ValueError)


@contextmanager
def named_failure(what: str):
    """Bad input becomes a Dagster Failure whose description names the problem, not a stack trace."""
    try:
        yield
    except USER_ERRORS as exc:
        raise Failure(description=f"{what}: {exc}") from exc


def training_group(pipeline: Pipeline) -> str:
    """The asset group of the pipeline's own stages: "Materialize all" in it never starts a retraining."""
    return f"{pipeline.name}_training"


def retraining_group(pipeline: Pipeline) -> str:
    """The asset group of the retraining from chat feedback (assets/retraining.py)."""
    return f"{pipeline.name}_retraining"


def key(pipeline: Pipeline, name: str) -> AssetKey:
    return AssetKey([pipeline.name, name])


def ins_for(pipeline: Pipeline, stage: Stage, *names: str, upstream: list[str] | None = None) -> dict[str, AssetIn]:
    """The stage's upstream assets under the parameter names its asset function takes, in order. upstream:
    for stages outside the pipeline's list (feedback retraining), the assets they read."""
    upstream = upstream or pipeline.upstream(stage.name)
    return {name: AssetIn(key=key(pipeline, asset_name)) for name, asset_name in zip(names, upstream)}


def local_inputs(store: ArtifactStore, inputs: dict) -> dict:
    """Upstream artifacts as local directories: fetched from the store's artifact_uri when this machine has no
    copy (a step on another node than the one that made them)."""
    return {name: str(store.local(path)) for name, path in inputs.items()}
