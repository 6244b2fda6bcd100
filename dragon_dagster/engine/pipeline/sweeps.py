"""A sweep: named sets of per-run settings to try, one run of the pipeline each, and how to rank the runs.

    sweeps:
      lr_rank:
        method: grid              # every combination; or random: `points` of them, drawn with `seed`
        over:
          sft_adapter.args.learning_rate: [1.0e-4, 5.0e-4]
          sft_adapter.lora.r: [8, 16]
        metric: eval/loss         # a metric of the evaluate stage's MLflow run; `dragon compare` ranks by it
        goal: minimize
        profile: quick            # optional: a profile under every point

Each key of `over` is `<stage>.<setting>[.<nested setting>]`, a per-run setting as a profile names it; the pipeline
checks every value against the stage's settings model (pipeline/definition.py). This module is framework-free: the
points, their overrides and the ranking; submitting the points as Dagster runs is assets/sweep.py's.
"""

from __future__ import annotations

import itertools
import math
import random
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from ..config.settings import Settings, overlay


class Sweep(Settings):
    """Settings to try, one run of the pipeline's job per point, ranked by a metric of the evaluation."""

    description: str = Field("", description="What the sweep is for; shown on the pipeline's job.")
    method: Literal["grid", "random"] = Field(
        "grid", description="grid: every combination of the values; random: `points` combinations drawn with `seed`."
    )
    over: dict[str, list[Any]] = Field(
        min_length=1,
        description="The values to try, by `<stage>.<setting>[.<nested setting>]` (a per-run setting, as in a "
        "profile): {sft_adapter.args.learning_rate: [1.0e-4, 5.0e-4]}.",
    )
    points: int | None = Field(None, ge=1, description="With method random: how many combinations to draw.")
    seed: int = Field(0, description="With method random: the draw's seed (the same seed, the same points).")
    metric: str = Field(
        "eval/loss",
        description="What `dragon compare` ranks the points by: a metric of the evaluate stage's MLflow run "
        "(eval/loss, eval/perplexity, judge/<name>_win_rate, ...).",
    )
    goal: Literal["minimize", "maximize"] = Field("minimize", description="Whether a lower or higher metric wins.")
    stage: str | None = Field(
        None, description="The evaluate stage whose run logs the metric. Default: the pipeline's last one."
    )
    profile: str | None = Field(None, description="A profile of this pipeline put under every point.")

    @field_validator("over")
    @classmethod
    def _values_to_try(cls, over: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for key, values in over.items():
            if len(key.split(".")) < 2 or not all(key.split(".")):
                raise ValueError(f"{key!r} is not <stage>.<setting> (e.g. sft_adapter.args.learning_rate)")
            if not values:
                raise ValueError(f"{key!r} has an empty list of values: give at least one")
        return over

    @model_validator(mode="after")
    def _points_for_random(self):
        size = math.prod(len(v) for v in self.over.values())
        if self.method == "random" and self.points is None:
            raise ValueError("method random needs `points`: how many combinations to draw")
        if self.method == "grid" and self.points is not None:
            raise ValueError(f"`points` is for method random; a grid runs every combination ({size})")
        if self.method == "random" and self.points > size:
            raise ValueError(f"points {self.points} is more than the {size} distinct combinations of `over`")
        return self

    def grid(self) -> list[dict[str, Any]]:
        """Every combination, the first key's values varying slowest."""
        keys = list(self.over)
        return [dict(zip(keys, values)) for values in itertools.product(*self.over.values())]

    def settings(self) -> list[dict[str, Any]]:
        """The points, in order: each a {`stage.setting`: value} mapping. Random draws distinct combinations,
        the same ones for the same seed."""
        grid = self.grid()
        if self.method == "grid":
            return grid
        picked = sorted(random.Random(self.seed).sample(range(len(grid)), self.points))
        return [grid[i] for i in picked]


def nested(point: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{`sft_adapter.args.learning_rate`: 1e-4} as per-stage overrides: {sft_adapter: {args: {learning_rate: 1e-4}}}."""
    out: dict[str, dict[str, Any]] = {}
    for key, value in point.items():
        *path, last = key.split(".")
        top: dict[str, Any] = {last: value}
        for part in reversed(path):
            top = {part: top}
        out = overlay(out, top)
    return out


def best_point(rows: list[dict[str, Any]], goal: str) -> dict[str, Any] | None:
    """The row whose `metric` is lowest (minimize) or highest (maximize); rows without a finite metric (a point
    that failed, or has not run) take no part. Ties go to the earlier point."""
    scored = [r for r in rows if isinstance(r.get("metric"), (int, float)) and math.isfinite(r["metric"])]
    if not scored:
        return None
    sign = 1 if goal == "minimize" else -1
    return min(scored, key=lambda r: sign * r["metric"])
