"""What every dataset stage kind shares: where its table comes from, the held-out split, and the hooks generic code
calls instead of branching on the kind (map the table into rows, the columns preflight checks, its checks)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, model_validator

from ..config.checks import CheckSpec
from ..config.stage import Stage
from .checks import leakage_check, quality_check
from .errors import DataError
from .row_mapping import render, template_fields
from .tables import read_table

# Settings of a dataset stage that name a column or a {column} template (checked against the file's header).
MAPPING_FIELDS = ("prompt", "response", "conversations", "chosen", "rejected", "reply", "label", "reference", "system")


class DatasetStage(Stage):
    source: str | None = Field(None, description="A dataset under `datasets:` to map (or give `path`).")
    path: str | None = Field(
        None,
        description="A file to read directly (CSV, JSONL, JSON, Parquet, a saved "
        "`datasets` directory), relative to the pipeline's folder; "
        "'example:NAME' reads a bundled example file.",
    )
    format: Literal["csv", "jsonl", "json", "parquet"] | None = Field(
        None, description="File format when the extension does not tell."
    )
    system: str | None = Field(None, description="System prompt: text or a template such as '{persona}'.")
    eval_frac: float = Field(0.05, ge=0, lt=1, description="Share of rows held out for evaluation, in [0, 1).")
    seed: int = Field(42, description="Seed of the held-out split.")
    dedupe: bool = Field(
        True,
        description="Drop exact duplicate rows (same prompt turns and same reply or answer) "
        "before the split; the count is in the asset's metadata.",
    )
    group_by: str | None = Field(
        None,
        description="A source column or a template such as '{subject}': rows with "
        "the same value go to the same side of the split. Default: rows "
        "with the same user prompt stay together.",
    )
    allow_leakage: bool = Field(
        False,
        description="Let the stages after this one run even when held-out prompts "
        "or answers also appear in train (the held_out_not_leaking "
        "check then only warns).",
    )

    @model_validator(mode="after")
    def _one_origin(self):
        if (self.source is None) == (self.path is None):
            raise ValueError(f"dataset stage {self.name!r} needs exactly one of source (a dataset name) or path")
        return self

    def reads(self) -> list[str]:
        return [self.source] if self.source else []

    makes: ClassVar[str] = "chat"  # the rows it holds: chat, pairs, rated or prompts (what trainers check)
    # Whether held-out answers repeating training answers is a leak: true for replies trained on as text, false
    # for a prompt dataset's reference answers (a number, a label), which repeat across prompts by nature.
    answers_are_text: ClassVar[bool] = True

    def map(self, df) -> tuple[list[dict], dict[str, int], list[int]]:
        """(rows, dropped counts by reason, the source row each row came from) for this kind's mapping."""
        raise NotImplementedError

    def layout_problems(self, columns: list[str]) -> list[str]:
        """What keeps this stage's mapping from reading a table with these columns, beyond missing named columns
        (a kind that detects its layout checks that one fits)."""
        return []

    def mapped_columns(self) -> dict[str, str]:
        """role -> the column or template this stage reads."""
        return {role: getattr(self, role) for role in MAPPING_FIELDS if getattr(self, role, None)}

    def checks(self) -> list[CheckSpec]:
        return [quality_check(), leakage_check(self.allow_leakage, answers_count=self.answers_are_text)]

    def source_file(self, pipeline) -> tuple[str | Path, str | None]:
        """(path, format) of the file this stage reads: its `datasets:` entry's, else its own."""
        source = pipeline.datasets[self.source] if self.source else None
        return (source.path if source else self.path), self.format or (source.format if source else None)

    def per_row_system(self, pipeline) -> bool:
        """Whether `system` is filled from each row (a column's name, as the mapping reads it, or a {column}
        template) rather than one text for every row."""
        spec = self.system
        if not spec:
            return False
        if "{" in spec or "}" in spec:
            return True
        path, fmt = self.source_file(pipeline)
        try:
            columns = columns_of(path, fmt)
            return spec in (columns if columns is not None else read_table(path, fmt).columns)
        except (DataError, OSError, ValueError):  # unreadable here: preflight and the dataset step say why
            return False

    def one_system(self, pipeline) -> str | None:
        """The system prompt every row of this stage gets: its `system:` text, or the value its column (or
        template) has on every row of the file; None when it has none or the value differs between rows."""
        if not self.per_row_system(pipeline):
            return self.system or None
        path, fmt = self.source_file(pipeline)
        try:
            values = {render(self.system, record) for record in read_table(path, fmt).to_dict("records")}
        except (DataError, OSError, ValueError, KeyError):
            return None
        return values.pop() or None if len(values) == 1 else None

    def preflight(self, pipeline) -> list[str]:
        """Every column this stage's mapping names, checked against the file's header (a missing column fails the
        run before minutes of training, not after)."""
        path, fmt = self.source_file(pipeline)
        columns = columns_of(path, fmt)
        if columns is None:
            return []
        found = self.layout_problems(columns)
        for role, spec in self.mapped_columns().items():
            if role == "system" and "{" not in spec:
                continue  # constant text
            try:
                missing = [] if spec in columns else [c for c in template_fields(spec) if c not in columns]
            except DataError as exc:
                found.append(f"{self.name}: {exc}")
                continue
            if missing:
                found.append(f"{self.name}: {role} {spec!r} names missing column(s) {missing}; {path} has {columns}")
        return found


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
