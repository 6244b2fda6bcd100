"""The job: what the Dagster layer asks a worker to do, across the process boundary, as one typed model.

`Job[Settings, Inputs]` is the same class for every kind: the stage's settings (its kind's model), the inputs its
worker reads (a kind's own model, or one of the shared ones below), where to write, and how to run (hardware,
speed, data parallelism). The Dagster layer builds it (assets/), the training resource writes it as job.json
beside the artifact, and the worker parses it back with the same model (runtime/worker.py) before anything
loads, so a foreign or corrupt job file is a named error, not a KeyError in the middle of a run.

Fields typed `JobPath` hold a local path (or a hub id): job.json keeps those inside the artifact relative to it
(`relative_paths`), and a job shipped to a worker on another node has them rewritten as URIs in the artifact
store (runtime/remote.py), both found by walking the model, never by a list of names.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Generic, Literal, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field

from .hardware import Hardware, Speed


class Located:
    """Marks a job field that holds a path: relativized in job.json, turned into a URI for a remote worker."""

    def __repr__(self) -> str:
        return "Located()"


LOCATED = Located()
JobPath = Annotated[str, LOCATED]


class Contract(BaseModel):
    """Every model that crosses the process boundary: unknown keys are errors (a renamed field fails loudly), and
    a NaN stays NaN in JSON (as json.dumps writes it), so a result reads back as it was written."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")


class Parallel(Contract):
    """How one training stage spreads over data-parallel workers (TrainingResource.workers > 1)."""

    workers: int = Field(ge=1)
    backend: Literal["torchrun", "ray"] = "torchrun"
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 0.0
    memory_gb_per_worker: float = 0.0


class RemoteTarget(Contract):
    """Set on a job shipped through the artifact store: where its inputs are and where its output goes."""

    artifact_uri: str
    output_uri: str


class ToolsInput(Contract):
    """The pipeline's tools as a worker loads them (engine/tools/declare.py's Tools, its file copied into the
    artifact so the job is self-contained): the same rendering and the same tools wherever the job runs."""

    file: JobPath | None = None
    schemas: list[dict[str, Any]] = []
    timeout: float = 10.0
    max_calls: int = 4


class RewardModelInput(Contract):
    """A reward_model stage's model as a worker loads it: the base it was trained on, and its adapter with the
    scalar head (the stage's artifact's adapter/)."""

    stage: str
    model: JobPath
    adapter: JobPath
    mlflow_run_id: str | None = None  # the reward model's own MLflow run: a lineage tag on the runs it scores


class StageArtifact(Contract):
    """The artifact of a stage another one reads in a role its kind declares (config/stage.py's StageInput)."""

    role: str
    stage: str
    path: JobPath


class ReferencedModel(Contract):
    """A model a stage names by where it is (config/stage.py's ModelReference), resolved by the Dagster step."""

    role: str
    spec: str  # as the stage names it: models:/support@champion, a preset, a hub id, a directory
    path: JobPath  # what from_pretrained loads: a model directory or a hub id
    version: str | None = None  # a registered model's version, when spec names one by alias


class TrainingInputs(Contract):
    """What every training stage's worker reads: the starting model, the rows, where checkpoints go."""

    model: JobPath  # the resolved starting model: a directory or a hub id
    adapters: list[JobPath] = []  # earlier stages' adapters, folded in first
    train_file: JobPath
    eval_file: JobPath | None = None
    checkpoint_dir: JobPath  # survives a cancel; resume reads it
    resume_from: JobPath | None = None
    tools: ToolsInput | None = None  # the pipeline's tools: rendered in every conversation, run by tool stages
    reward_models: list[RewardModelInput] = []  # the reward_model stages its learned rewards name
    declared: list[StageArtifact] = []  # the stages its kind declares it reads (a teacher ...), by role
    referenced: list[ReferencedModel] = []  # the models its kind names by where they are (a teacher ...), by role

    def declared_as(self, role: str) -> dict[str, str]:
        """The artifacts of the stages it reads in this role, by stage name."""
        return {a.stage: a.path for a in self.declared if a.role == role}

    def referenced_as(self, role: str) -> list[ReferencedModel]:
        return [m for m in self.referenced if m.role == role]


class ModelInputs(Contract):
    """A model and the adapter chain folded into it (a merge, a student that samples)."""

    model: JobPath | None = None
    adapters: list[JobPath] = []


class SynthesisInputs(ModelInputs):
    """Rows made by models: the prompts (and reference replies) to start from, and the student, if any."""

    prompts_file: JobPath
    # the source's held-out rows: a stage that holds out rows of its own draws them from here, so what it scores on
    # was not trained on by the stages before it (None: hold out from prompts_file's rows)
    held_out_file: JobPath | None = None


S = TypeVar("S", bound=BaseModel)
I = TypeVar("I", bound=BaseModel)  # noqa: E741 - the inputs' type, as S is the settings'


class Job(Contract, Generic[S, I]):
    """One job for a worker. Parametrize with the kind's settings and inputs models: `Job[SFT, TrainingInputs]`."""

    settings: S
    inputs: I
    output_dir: JobPath  # the artifact's directory under its staging name; the worker writes there
    hardware: Hardware = Field(default_factory=Hardware)
    speed: Speed | None = None  # training jobs: the resource's speed settings
    parallel: Parallel | None = None  # training jobs on several workers
    remote: RemoteTarget | None = None  # a job that travels through the artifact store
    kind_module: str | None = None  # a stage kind registered outside this package: the worker imports it first


def map_paths(model: BaseModel, convert: Callable[[str], str]) -> BaseModel:
    """A copy of model with convert applied to every JobPath value, in nested models and lists too."""
    updates = {}
    for name, info in type(model).model_fields.items():
        value = getattr(model, name)
        marked = any(isinstance(m, Located) for m in info.metadata)
        new = _convert(value, info.annotation, convert, marked)
        if new is not value:
            updates[name] = new
    return model.model_copy(update=updates) if updates else model


def _is_path(annotation: Any) -> bool:
    return get_origin(annotation) is Annotated and any(isinstance(m, Located) for m in get_args(annotation)[1:])


def _convert(value: Any, annotation: Any, convert: Callable[[str], str], marked: bool = False) -> Any:
    if value is None:
        return None
    if marked or _is_path(annotation):
        return convert(value) if isinstance(value, str) else value
    if isinstance(value, BaseModel):
        return map_paths(value, convert)
    origin = get_origin(annotation)
    if origin is Annotated:
        return _convert(value, get_args(annotation)[0], convert)
    if origin in (Union, types.UnionType):
        for option in get_args(annotation):
            if option is not type(None) and (_is_path(option) or get_origin(option) in (list, Annotated)):
                return _convert(value, option, convert)
        return value
    if origin is list and isinstance(value, list):
        (item,) = get_args(annotation) or (Any,)
        converted = [_convert(v, item, convert) for v in value]
        return converted if any(a is not b for a, b in zip(converted, value)) else value
    return value


def relative_paths(job: BaseModel, root: str | Path) -> BaseModel:
    """The job as job.json keeps it: paths inside root (the artifact's staging dir) written "./<path in it>", "."
    for root itself.

    root is renamed when the artifact is complete, so an absolute path into it would name a directory that no
    longer exists; `absolute_paths(job, artifact_dir)` turns them back. A hub id is no path and stays as it is."""
    base = Path(root).resolve()

    def relative(value: str) -> str:
        if not Path(value).is_absolute():
            return value
        try:
            inside = Path(value).resolve().relative_to(base).as_posix()
        except ValueError:  # outside the artifact (an upstream artifact, the checkpoints): kept absolute
            return value
        return f"./{inside}" if inside and inside != "." else "."

    return map_paths(job, relative)


def absolute_paths(job: BaseModel, root: str | Path) -> BaseModel:
    """A job read back from an artifact's job.json, its paths relative to the artifact made absolute again."""
    base = Path(root).resolve()

    def absolute(value: str) -> str:
        if value == ".":
            return str(base)
        return str(base / value[2:]) if value.startswith("./") else value

    return map_paths(job, absolute)
