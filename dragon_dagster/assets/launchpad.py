"""Launchpad config made from a stage's settings model: the per-run fields, nested as in the YAML, each
defaulting to the value this pipeline gives it (its YAML, else the kind's default) and described by the
model's field docs. A run's config is put into the stage's settings model field by field (with_values) and
validated by the same model.
"""

from __future__ import annotations

from typing import Any

from dagster import Config, Failure
from pydantic import Field, ValidationError, create_model

from ..engine.config.settings import Settings, tunable_fields, with_values
from ..engine.config.stage import Stage
from ..engine.pipeline import Pipeline, describe

LAUNCH_ONLY = {"resume"}  # launchpad fields that are not settings of the stage
RESUME = (bool, Field(False, description="Continue from the last complete checkpoint a cancelled or failed run left."))


def launchpad_config(stage: Stage, **extra: tuple[type, Any]) -> type[Config]:
    """The Config class of a stage's asset; extra adds launch-only fields such as resume."""
    return _config_class(stage, _camel(stage.name) + "Config", extra)


def _config_class(settings: Settings, class_name: str, extra: dict | None = None) -> type[Config]:
    fields: dict[str, Any] = {}
    for name, annotation in tunable_fields(type(settings)).items():
        value, doc = getattr(settings, name), type(settings).model_fields[name].description
        if isinstance(value, Settings):
            nested = _config_class(value, class_name[: -len("Config")] + _camel(name) + "Config")
            fields[name] = (nested, Field(default_factory=nested, description=doc))
        else:
            fields[name] = (annotation, Field(value, description=doc))
    return create_model(class_name, __base__=Config, **fields, **(extra or {}))


def effective(stage: Stage, config: Config) -> Stage:
    """The stage's settings with this run's launchpad values put in, checked by the stage's model."""
    return effective_values(stage, config_values(config))


def config_values(config: Config) -> dict[str, Any]:
    """A launchpad config's values by field, as its class holds them (a nested config: its own values)."""
    return {
        name: config_values(value) if isinstance(value, Config) else value
        for name in type(config).model_fields
        for value in [getattr(config, name)]
    }


def effective_values(stage: Stage, values: dict[str, Any]) -> Stage:
    """The stage's settings with a run's config values for it (as its run config holds them) put in."""
    values = {k: v for k, v in values.items() if k not in LAUNCH_ONLY}
    try:
        return with_values(stage, values)
    except ValidationError as exc:
        raise Failure(description=f"{stage.name}: run config: {describe(exc)}") from None


def run_settings(pipeline: Pipeline, run_config: dict) -> dict[str, Stage]:
    """Every stage's effective settings in a Dagster run of the pipeline, by stage name: its YAML with the run's
    config for it (a profile's, a sweep point's, the launchpad's) put in, as each stage's asset computes them."""
    ops = (run_config or {}).get("ops") or {}
    return {
        stage.name: effective_values(stage, (ops.get(f"{pipeline.name}__{stage.name}") or {}).get("config") or {})
        for stage in pipeline.stages
    }


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))
