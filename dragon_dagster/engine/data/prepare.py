"""A dataset stage's table made into its train and held-out rows, with the figures its checks judge: what the
dataset asset writes and what the studio previews, computed once, the same way."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..artifacts.manifest import PiiReport
from . import holdout, mixture, near_dups, pii, row_parts
from .errors import DataError
from .stage import DatasetStage


@dataclass
class Prepared:
    train: list[dict]
    held: list[dict]
    dropped: dict[str, int]  # rows the mapping dropped, by reason
    duplicates: int  # exact duplicates dropped before the split
    leakage: dict[str, float]  # prompt_overlap, near_prompt_overlap, answer_overlap, identifying_answer_overlap
    quality: dict[str, Any]  # rows, empty prompts and replies, duplicate share (checks.quality_check)
    mixture: list[dict[str, Any]] = field(default_factory=list)  # a mixture's proportions (mixture.proportions)
    near_duplicates: dict[str, Any] | None = None  # near_dups.Found.report; None when the search is off
    pii: PiiReport | None = None  # personal data found (pii.scan_rows), redacted when the stage says so

    @property
    def rows(self) -> list[dict]:
        return self.train + self.held


def prepare(settings: DatasetStage, df) -> Prepared:
    """Map the table, drop exact duplicates (when the stage dedupes), find near-duplicate prompts (dropping all
    but one of each cluster with dedupe: near), split by group (group_by, else the user prompt and its near-copies:
    rows asking the same thing stay on one side) and measure the leak and the quality.

    df: the table; for a stage with `sources`, a mapping of each source's label to its table. A mixture's
    sources are each mapped, then drawn together, and the rest runs on the whole mixture: a prompt that two
    sources share lands on one side of the split, and a row two sources share is dropped once.

    Personal data is looked for in the mapped rows (what trains), and redacted there before duplicates are
    dropped (rows differing only in it are then duplicates) when the stage's `pii` says so."""
    if settings.sources:
        rows, dropped, groups, origin, where = _mixed(settings, df)
    else:
        rows, dropped, kept = settings.map(df)
        groups, origin, where = _groups(settings, df, rows, kept), [0] * len(rows), [(None, i) for i in kept]
    rows, scanned = pii.scan_rows(rows, settings.pii, where)
    duplicates, drawn = 0, origin
    if settings.dedupe != "off":  # each row's source goes along with its group, so the kept rows' sources are known
        rows, tagged, duplicates = holdout.dedupe_rows(rows, list(zip(groups, origin, strict=True)))
        groups, origin = [g for g, _ in tagged], [o for _, o in tagged]
    found, report = None, None
    if settings.near_duplicates.find and rows:
        texts = [row_parts.user_text(r) for r in rows]
        found = near_dups.find(texts, settings.near_duplicates)
        if settings.dedupe == "near":
            keep = found.firsts()
            report = found.report(texts, dropped=len(rows) - len(keep))
            rows, groups, origin = ([values[i] for i in keep] for values in (rows, groups, origin))
            found = None  # one row of each cluster is left: no near-copies among them
        else:
            report = found.report(texts)
            if not settings.group_by:  # a cluster holds every row of its user prompt, and its near-copies
                groups = [f"near-duplicates of row {label}" for label in found.labels.tolist()]
    train, held = holdout.split_rows(rows, settings.eval_frac, settings.seed, groups)
    proportions = []
    if settings.sources:
        labels, weights = [s.label for s in settings.sources], [s.weight for s in settings.sources]
        proportions = mixture.proportions(labels, weights, drawn, origin)
    leakage = holdout.overlap(train, held, _near_prompts(rows, held, found))
    return Prepared(train, held, dropped, duplicates, leakage, row_parts.quality(rows), proportions, report, scanned)


def _near_prompts(rows: list[dict], held: list[dict], found: near_dups.Found | None) -> list[bool] | None:
    """For each held-out row, whether a near-copy pair joins its prompt to a training row's (not only its cluster:
    a chain of near-copies through other held-out rows is no near-copy of train)."""
    if found is None:
        return None
    position = {id(r): k for k, r in enumerate(held)}
    side = np.array([id(r) in position for r in rows], dtype=bool)  # held out
    flags = [False] * len(held)
    pairs = found.pairs
    across = pairs[side[pairs[:, 0]] != side[pairs[:, 1]]]
    for i, j in across.tolist():
        flags[position[id(rows[i] if side[i] else rows[j])]] = True
    return flags


def _groups(settings: DatasetStage, df, rows: list[dict], kept: list[int]) -> list[str]:
    """Each mapped row's group: its source row's group_by value, else its user prompt."""
    if settings.group_by:  # read from the source table, carried along with the rows it maps to
        values = holdout.group_values(df, settings.group_by)
        return [values[i] for i in kept]
    return [row_parts.user_text(r) for r in rows]


def _mixed(settings: DatasetStage, tables: dict) -> tuple[list[dict], dict[str, int], list[str], list[int], list]:
    """A mixture's rows as drawn, the mapping's drops summed over the sources, each row's group, the index of
    the source it came from and (its source's label, its row there). An error in one source's mapping names that
    source."""
    mapped, dropped = [], Counter()
    for source in settings.sources:
        if source.label not in tables:
            raise DataError(f"{settings.name}: no table for source {source.label!r}; tables: {sorted(tables)}")
        try:
            rows, drops, kept = settings.map(tables[source.label])
            groups = _groups(settings, tables[source.label], rows, kept)
        except DataError as exc:
            raise DataError(f"source {source.label!r}: {exc}") from exc
        mapped.append((rows, groups, [(source.label, k) for k in kept]))
        dropped.update(drops)
    order = mixture.draw(
        [len(rows) for rows, *_ in mapped],
        [s.weight for s in settings.sources],
        settings.seed,
        settings.stopping_strategy,
        settings.mix_rows,
    )
    rows = [mapped[i][0][j] for i, j in order]
    groups = [mapped[i][1][j] for i, j in order]
    return rows, dict(dropped), groups, [i for i, _ in order], [mapped[i][2][j] for i, j in order]
