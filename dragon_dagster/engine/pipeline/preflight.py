"""Preflight: what can be checked about a whole pipeline's data before any stage trains.

Settings are checked when definitions load (the stage models). What needs the files (every column that a
dataset stage's mapping names, a reference column for rewards that compare with one) is checked here, each
stage by its own `preflight` hook, from the files' headers only, at the start of each training stage's step: a
missing column in a dataset that a later stage reads fails the run before minutes of training, not after.
"""

from __future__ import annotations

from .definition import Pipeline


def problems(pipeline: Pipeline) -> list[str]:
    """Every data problem a run of this pipeline would meet, each naming the stage, the file and the column."""
    return [problem for stage in pipeline.stages for problem in stage.preflight(pipeline)]
