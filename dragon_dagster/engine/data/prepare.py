"""A dataset stage's table made into its train and held-out rows, with the figures its checks judge: what the
dataset asset writes and what the studio previews, computed once, the same way."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import holdout, row_parts
from .stage import DatasetStage


@dataclass
class Prepared:
    train: list[dict]
    held: list[dict]
    dropped: dict[str, int]  # rows the mapping dropped, by reason
    duplicates: int  # exact duplicates dropped before the split
    leakage: dict[str, float]  # prompt_overlap, answer_overlap
    quality: dict[str, Any]  # rows, empty prompts and replies, duplicate share (checks.quality_check)

    @property
    def rows(self) -> list[dict]:
        return self.train + self.held


def prepare(settings: DatasetStage, df) -> Prepared:
    """Map the table, drop exact duplicates (when the stage dedupes), split by group (group_by, else the user
    prompt: rows asking the same thing stay on one side) and measure the leak and the quality."""
    rows, dropped, kept = settings.map(df)
    if settings.group_by:  # read from the source table, carried along with the rows it maps to
        values = holdout.group_values(df, settings.group_by)
        groups = [values[i] for i in kept]
    else:
        groups = [row_parts.user_text(r) for r in rows]
    duplicates = 0
    if settings.dedupe:
        rows, groups, duplicates = holdout.dedupe_rows(rows, groups)
    train, held = holdout.split_rows(rows, settings.eval_frac, settings.seed, groups)
    return Prepared(train, held, dropped, duplicates, holdout.overlap(train, held), row_parts.quality(rows))
