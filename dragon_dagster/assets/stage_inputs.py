"""The inputs a stage's kind declares besides its dataset and the chain (engine/config/stage.py, StageInput) as
Dagster asset inputs, and the step's inputs handed back by role: one place builds the names, and nothing parses
them back (the declared inputs travel beside the names)."""

from __future__ import annotations

from dagster import AssetIn, AssetKey

from ..engine.config.stage import Stage, StageInput
from ..engine.pipeline import Pipeline


def declared_ins(pipeline: Pipeline, stage: Stage) -> dict[str, tuple[StageInput, AssetIn]]:
    """Each declared input by the asset input name it gets (role and stage: unique, a Python identifier)."""
    return {
        f"{extra.role}_{extra.stage}": (extra, AssetIn(key=AssetKey([pipeline.name, extra.stage])))
        for extra in stage.extra_inputs()
    }


def asset_ins(declared: dict[str, tuple[StageInput, AssetIn]]) -> dict[str, AssetIn]:
    return {name: asset_in for name, (_, asset_in) in declared.items()}


def by_role(
    declared: dict[str, tuple[StageInput, AssetIn]], inputs: dict[str, str | None]
) -> dict[str, dict[str, str | None]]:
    """The step's declared inputs as {role: {stage: artifact}} (None for an upstream that made nothing: a skipped
    reward model of a retraining)."""
    out: dict[str, dict[str, str | None]] = {}
    for name, (extra, _) in declared.items():
        out.setdefault(extra.role, {})[extra.stage] = inputs.get(name)
    return out


def undeclared(declared: dict[str, tuple[StageInput, AssetIn]], inputs: dict[str, str]) -> dict[str, str]:
    """The step's other inputs (its datasets by name)."""
    return {name: path for name, path in inputs.items() if name not in declared}
