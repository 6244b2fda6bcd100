"""A dataset stage that reads several sources with weights: each source's place in the mixture, the draw itself
(datasets' interleave_datasets, seeded) and the proportions the mixture ended up with."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from ..config.settings import Settings
from .errors import DataError

# datasets.interleave_datasets' stopping strategies, as its `stopping_strategy` argument names them.
StoppingStrategy = Literal["first_exhausted", "all_exhausted", "all_exhausted_without_replacement"]


class MixSource(Settings):
    """One source of a mixture: a dataset under `datasets:` (or a file) and its weight."""

    source: str | None = Field(None, description="A dataset under `datasets:` (or give `path`).")
    path: str | None = Field(
        None,
        description="A file to read directly (CSV, JSONL, JSON, Parquet, a saved `datasets` directory), relative "
        "to the pipeline's folder; 'example:NAME' reads a bundled example file.",
    )
    format: Literal["csv", "jsonl", "json", "parquet"] | None = Field(
        None, description="File format when the extension does not tell."
    )
    weight: float = Field(
        json_schema_extra={"exclusiveMinimum": 0},
        allow_inf_nan=False,
        description="Its share of the rows drawn, relative to the other sources' weights (normalised to sum to "
        "1: weights 3 and 1 draw three rows of the first for one of the second). Above 0.",
    )

    @field_validator("weight")
    @classmethod
    def _positive(cls, weight: float) -> float:
        if weight <= 0:
            raise ValueError(
                f"weight {weight} is not above 0: a weight is the source's share of the mixture; remove the "
                "source to leave it out"
            )
        return weight

    @model_validator(mode="after")
    def _one_origin(self):
        if (self.source is None) == (self.path is None):
            raise ValueError("each of sources needs exactly one of source (a dataset name) or path")
        return self

    @property
    def label(self) -> str:
        """How the mixture's figures name it: the dataset's name, or the file's."""
        return self.source or Path(self.path).name


def draw(sizes: list[int], weights: list[float], seed: int, strategy: StoppingStrategy, rows: int | None):
    """Which rows of which source the mixture takes, in order: (source index, row index) pairs.

    datasets.interleave_datasets draws them (a source chosen at random by its normalised weight for each row,
    seeded; the strategy says when the draw stops). It interleaves each source's row numbers rather than the rows:
    the mapped chat rows stay Python objects (nested turns, tool calls) that Arrow would have to type alike
    across sources. rows: the first that many of the draw (None: all the strategy gives)."""
    import datasets

    total = sum(weights)
    parts = [datasets.Dataset.from_dict({"source": [i] * n, "row": list(range(n))}) for i, n in enumerate(sizes)]
    mixed = datasets.interleave_datasets(
        parts, probabilities=[w / total for w in weights], seed=seed, stopping_strategy=strategy
    )
    if rows is not None:
        if rows > len(mixed):
            more = "" if strategy == "all_exhausted" else ", or use all_exhausted (it repeats a source that runs out)"
            raise DataError(
                f"mix_rows {rows} is more than the {len(mixed)} rows the {strategy} strategy draws from sources of "
                f"{sizes} rows: lower mix_rows{more}"
            )
        mixed = mixed.select(range(rows))
    taken = mixed[:]  # one batch read: a column read row by row costs seconds at 10,000 rows
    return list(zip(taken["source"], taken["row"], strict=True))


def proportions(
    labels: list[str], weights: list[float], drawn: list[int], kept: list[int]
) -> list[dict[str, float | int | str]]:
    """Per source: its asked weight (normalised), the rows drawn from it, the rows it has in the dataset (after
    duplicates are dropped) and their share of the dataset. drawn, kept: the source index of each row."""
    total, size = sum(weights), len(kept)
    return [
        {
            "source": label,
            "weight": round(weight / total, 4),
            "drawn": drawn.count(i),
            "rows": kept.count(i),
            "share": round(kept.count(i) / size, 4) if size else 0.0,
        }
        for i, (label, weight) in enumerate(zip(labels, weights, strict=True))
    ]
