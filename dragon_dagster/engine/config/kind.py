"""A stage kind: everything generic code needs to know about one, in one entry.

Each kind lives in a folder of its own under stages/ (its settings model, worker, result model, checks and report
figures) and describes itself with one `StageKind`; catalog.py lists them. The Dagster layer builds the
kind's asset by its `role` and attaches its `checks`; the worker parses the kind's `Job` and calls its `worker`
function; the Dagster layer validates what comes back with `result`. Nothing generic branches on a kind's name.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, get_args

from pydantic import BaseModel

from .checks import CheckSpec
from .job import Job
from .reporter import Reporter
from .results import StageResult
from .stage import Stage

# How a kind fits in a pipeline, which decides the asset the Dagster layer builds for it and what it reads:
# dataset (rows mapped from a table, in the Dagster step), synthesis (rows made by models, in a worker),
# training (an adapter, continuing the chain), merge_adapters (adapters it names combined into one adapter, which the
# chain continues from), merge (the chain folded into the base), evaluate (base against merged), export (the
# merged model as files to run elsewhere).
Role = Literal["dataset", "synthesis", "training", "merge_adapters", "merge", "evaluate", "export"]


def _no_checks(stage: Stage) -> list[CheckSpec]:
    return []


@dataclass(frozen=True)
class StageKind:
    settings: type[Stage]  # the YAML's model; its `kind` Literal is the kind's name
    role: Role
    inputs: type[BaseModel] | None = None  # what its worker reads; None: it runs in the Dagster step
    result: type[StageResult] | None = None  # what its worker reports
    worker: str | None = None  # "module:function" that runs its job in the worker (imported only there)
    checks: Callable[[Stage], list[CheckSpec]] = _no_checks  # the asset checks of a stage of this kind
    summary: str = ""  # one line for the docs' stage reference
    # The version of the kind's code, part of every stage's version (pipeline/versions.py): bump it when the same
    # settings on the same inputs would now make a different artifact, so the stages of this kind go unsynced.
    version: str = "1"
    # "module:function" that builds the kind's TRL config from its settings (a training kind's trl_config.py):
    # to_trl_config(settings, run, ...), imported only in a worker (it loads TRL)
    trl_config: str | None = None

    @property
    def name(self) -> str:
        (name,) = get_args(self.settings.model_fields["kind"].annotation)
        return name

    @property
    def module(self) -> str:
        """The module of its settings model: a worker imports it first, so that a kind registered outside this
        package (by that module, when it is imported) is known in the worker's process too."""
        return self.settings.__module__

    def load_worker(self) -> Callable[[Any, Reporter], StageResult | None]:
        """The function that runs this kind's job, imported on first use (TRL and torch load only in a worker)."""
        if self.worker is None:
            raise TypeError(f"stage kind {self.name!r} runs in the Dagster step: it has no worker")
        module, function = self.worker.split(":")
        return getattr(importlib.import_module(module), function)

    def load_trl_config(self) -> Callable[..., Any]:
        """The function that builds this kind's TRL config from its settings (TRL loads only when it is called)."""
        if self.trl_config is None:
            raise TypeError(f"stage kind {self.name!r} trains with no TRL config")
        module, function = self.trl_config.split(":")
        return getattr(importlib.import_module(module), function)

    def job_model(self) -> type[Job]:
        """The typed job of this kind: Job[its settings, its inputs]."""
        if self.inputs is None:
            raise TypeError(f"stage kind {self.name!r} runs in the Dagster step: it has no worker job")
        return Job[self.settings, self.inputs]
