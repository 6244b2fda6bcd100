"""Preflight: what can be checked about a whole pipeline's data before any stage trains.

Settings are checked when definitions load (the stage models). What needs the files — every column that a
dataset stage's mapping names, and a reference column for rewards that compare with one — is checked here,
from the files' headers only, at the start of each training stage's step: a missing column in a dataset
that a later stage reads fails the run before minutes of training, not after.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..rewards import NEEDS_REFERENCE
from . import stages as st
from .pipeline import Pipeline


def columns_of(path: str | Path, format: str | None = None) -> list[str] | None:
    """A table's column names from its header (CSV's first line, JSONL's first record, Parquet's schema);
    None where that cannot be told cheaply (a `datasets` directory, plain JSON)."""
    path = Path(path)
    fmt = format or {".csv": "csv", ".jsonl": "jsonl", ".parquet": "parquet", ".pq": "parquet"}.get(path.suffix.lower())
    if not path.is_file() or fmt is None:
        return None
    if fmt == "csv":
        import csv

        with path.open(newline="", encoding="utf-8", errors="replace") as f:
            return next(csv.reader(f), [])
    if fmt == "jsonl":
        with path.open(encoding="utf-8", errors="replace") as f:
            first = next((line for line in f if line.strip()), "{}")
        record = json.loads(first)
        return list(record) if isinstance(record, dict) else None
    if fmt == "parquet":
        import pyarrow.parquet as pq

        return list(pq.read_schema(path).names)
    return None


def mapped_columns(stage: st.DatasetStage) -> dict[str, str]:
    """role -> the column or template a dataset stage reads."""
    roles = ("prompt", "response", "conversations", "chosen", "rejected", "reply", "label", "reference", "system")
    return {role: getattr(stage, role) for role in roles if getattr(stage, role, None)}


def problems(pipeline: Pipeline) -> list[str]:
    """Every data problem a run of this pipeline would meet, each naming the stage, the file and the column."""
    from ..data.tables import DataError, template_fields

    found = []
    for stage in pipeline.stages:
        if not isinstance(stage, st.DatasetStage):
            continue
        source = pipeline.datasets[stage.source] if stage.source else None
        path = source.path if source else stage.path
        columns = columns_of(path, stage.format or (source.format if source else None))
        if columns is None:
            continue
        for role, spec in mapped_columns(stage).items():
            if role == "system" and "{" not in spec:
                continue  # constant text
            try:
                missing = [] if spec in columns else [c for c in template_fields(spec) if c not in columns]
            except DataError as exc:
                found.append(f"{stage.name}: {exc}")
                continue
            if missing:
                found.append(f"{stage.name}: {role} {spec!r} names missing column(s) {missing}; {path} has {columns}")
    for stage in pipeline.stages:
        if isinstance(stage, st.GRPO):
            prompts = pipeline.stage(stage.dataset)
            needing = [r.get("name", r["type"]) for r in stage.rewards if r["type"] in NEEDS_REFERENCE]
            if needing and isinstance(prompts, st.PromptDataset) and not prompts.reference:
                found.append(
                    f"{stage.name}: reward(s) {needing} compare with a reference, but {prompts.name} "
                    "maps no reference column"
                )
    return found
