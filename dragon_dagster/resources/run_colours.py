"""The colour MLflow draws a run in, set by us where the UI's own choice misleads: its charts and compare view
colour a run by the `mlflow.runColor` tag when it has one (the tag the UI writes when someone picks a colour),
else by a hash of the run's id, so a report's base and merged runs could come out in one colour. The base model
is always grey; a merged model takes a colour from a palette with no grey in it, chosen by its Dagster run, so
two pipeline runs' merged models compared side by side still differ."""

from __future__ import annotations

import hashlib

COLOUR_TAG = "mlflow.runColor"
BASE_COLOUR = "#9e9e9e"
# Tableau 10 without its grey: saturated, told apart from BASE_COLOUR and from one another
PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f")


def model_colour(model: str, pipeline_run: str | None) -> str:
    """`model`: base (grey) or another model of a report (a palette colour keyed by the Dagster run that made
    the report: its report run and its evaluation run share it)."""
    if model == "base":
        return BASE_COLOUR
    digest = hashlib.sha256((pipeline_run or "").encode()).digest()
    return PALETTE[digest[0] % len(PALETTE)]


def colour_tag(model: str, pipeline_run: str | None) -> dict[str, str]:
    return {COLOUR_TAG: model_colour(model, pipeline_run)}
