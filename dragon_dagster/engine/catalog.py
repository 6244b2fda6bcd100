"""Every stage kind, by name: the built-in ones (one folder each, one line each below) and any registered from
outside this package with `register` (a plugin's module, a test's toy kind).

Generic code asks the catalog, never a kind's name: the pipeline finds a stage's model here, the Dagster layer
builds its asset by its kind's role and attaches its checks, the worker finds the function that runs its job.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Annotated, Any, Union

from pydantic import Field, TypeAdapter, ValidationError

from .artifacts.manifest import ManifestError, RecordedSettings
from .config.kind import StageKind
from .config.stage import Stage

KINDS: dict[str, StageKind] = {}

# Kinds that were renamed: a stage of the old kind reads as the kind its field names (or the default), with a
# warning that says what to write instead.
RENAMED = {"preference": ("method", "dpo")}


def register(kind: StageKind) -> StageKind:
    """Add a stage kind: pipelines can name it from now on, in this process and (through its module, which the
    job names) in the worker's."""
    known = KINDS.get(kind.name)
    if known is not None and known is not kind and known.settings is not kind.settings:
        raise ValueError(f"stage kind {kind.name!r} is registered already (by {known.module})")
    KINDS[kind.name] = kind
    _union.cache_clear()
    return kind


def unregister(name: str) -> None:
    """Forget a kind registered from outside (a test's toy kind, a plugin being unloaded)."""
    KINDS.pop(name, None)
    _union.cache_clear()


def get(name: str) -> StageKind:
    if name not in KINDS:
        raise ValueError(f"unknown stage kind {name!r}; known: {', '.join(KINDS)}")
    return KINDS[name]


def kind_of(stage: Stage) -> StageKind:
    return get(stage.kind)


@functools.cache
def _union():
    models = tuple(kind.settings for kind in KINDS.values())
    union = Annotated[Union[models], Field(discriminator="kind")]  # noqa: UP007 - built from a tuple at run time
    return union, TypeAdapter(union), TypeAdapter(list[union])


def stage_union():
    """The union of every registered kind's settings model, tagged by `kind` (for schemas and field types)."""
    return _union()[0]


def stage_list() -> TypeAdapter:
    return _union()[2]


def upgraded(data: Any, warn: Callable[[str], None] | None = None) -> Any:
    """A stage's mapping with a renamed kind replaced by today's (RENAMED), saying so through warn."""
    if not isinstance(data, dict) or data.get("kind") not in RENAMED:
        return data
    field, default = RENAMED[data["kind"]]
    data = dict(data)
    old, new = data.pop("kind"), data.pop(field, default)
    data["kind"] = new
    if warn:
        warn(
            f"stage {data.get('name')!r}: `kind: {old}` with `{field}: {new}` is now `kind: {new}` (its settings "
            f"are the same); reading it as kind: {new}. Write `kind: {new}` to silence this."
        )
    return data


def parse_stage(data: dict[str, Any]) -> Stage:
    """A stage's settings from a mapping (a YAML item): the model its kind names."""
    return _union()[1].validate_python(upgraded(data))


def recorded_stage(settings: Stage | RecordedSettings) -> Stage:
    """A manifest's settings read with the kind's own model (a manifest read back holds RecordedSettings)."""
    if isinstance(settings, Stage):
        return settings
    values = settings.model_dump()
    if values.get("kind") not in KINDS and values.get("kind") not in RENAMED:
        raise ManifestError(
            f"the recorded settings of stage {values.get('name')!r} name no known kind ({values.get('kind')!r}); "
            f"known: {', '.join(KINDS)}"
        )
    try:
        return parse_stage(values)
    except ValidationError as exc:
        raise ManifestError(
            f"the recorded settings of {values['kind']} stage {values.get('name')!r} no longer read as its kind's "
            f"model: {exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}"
        ) from None


def scores_replies(name: str | None) -> bool:
    """Whether stages of this kind train a model that scores replies (a reward model): what a learned reward and
    `dragon score` load."""
    return name in KINDS and KINDS[name].settings.scores_replies


def kinds_making(rows: str) -> list[str]:
    """Kinds whose artifacts hold rows of this shape (chat, pairs, rated, prompts)."""
    return [name for name, kind in KINDS.items() if getattr(kind.settings, "makes", None) == rows]


def kinds_training_on(rows: str) -> list[str]:
    return [name for name, kind in KINDS.items() if rows in getattr(kind.settings, "trains_on", ())]


# The built-in kinds, one line each: a folder of engine/stages/ whose KIND is registered here. Registering a new
# kind is its line; tests/engine/test_kind_homes.py checks that every folder has one.
BUILT_IN = [
    "chat_dataset",
    "pairs_dataset",
    "rated_dataset",
    "prompt_dataset",
    "preference_pairs",
    "synthetic_dataset",
    "sft",
    "dpo",
    "orpo",
    "kto",
    "reward_model",
    "grpo",
    "rloo",
    "distill",
    "merge_adapters",
    "merge",
    "evaluate",
    "export",
]
for _folder in BUILT_IN:
    register(importlib.import_module(f"{__package__}.stages.{_folder}").KIND)
