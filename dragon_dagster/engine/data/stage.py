"""What every dataset stage kind shares: where its table comes from, the held-out split, and the hooks generic code
calls instead of branching on the kind (map the table into rows, the columns preflight checks, its checks)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from ..config.checks import CheckSpec
from ..config.stage import Stage
from .checks import leakage_check, pii_check, quality_check
from .errors import DataError
from .mixture import MixSource, StoppingStrategy
from .near_dups import NearDuplicates
from .pii import PiiMode
from .row_mapping import render, template_fields
from .tables import read_table

# Settings of a dataset stage that name a column or a {column} template (checked against the file's header).
MAPPING_FIELDS = ("prompt", "response", "conversations", "chosen", "rejected", "reply", "label", "reference", "system")


class DatasetStage(Stage):
    source: str | None = Field(
        None, description="A dataset under `datasets:` to map (or give `path`, or several in `sources`)."
    )
    path: str | None = Field(
        None,
        description="A file to read directly (CSV, JSONL, JSON, Parquet, a saved "
        "`datasets` directory), relative to the pipeline's folder; "
        "'example:NAME' reads a bundled example file.",
    )
    format: Literal["csv", "jsonl", "json", "parquet"] | None = Field(
        None, description="File format when the extension does not tell."
    )
    sources: list[MixSource] | None = Field(
        None,
        description="A mixture instead of one source: several datasets under `datasets:` (or files), each with "
        "its weight, e.g. `[{source: tickets, weight: 3}, {source: faq, weight: 1}]`. Every source is mapped "
        "by this stage's columns (each needs them), the rows are drawn by datasets' interleave_datasets with "
        "the weights normalised and this stage's seed, and duplicates, the held-out split and the leak check "
        "are computed on the whole mixture. The rows each source got, and their share, are in the manifest and "
        "on the asset page.",
    )
    stopping_strategy: StoppingStrategy = Field(
        "first_exhausted",
        description="When a mixture stops drawing (datasets' interleave_datasets). first_exhausted, the "
        "default: when one source runs out, so no row is drawn twice and the shares follow the weights (rows "
        "of the other sources are left unused). all_exhausted: when every source has been used up once, "
        "repeating the rows of those that run out first (repeats are then dropped as duplicates when dedupe "
        "is on, which moves the shares off the weights). all_exhausted_without_replacement: every row once, "
        "each source drawn by weight until it runs out (the shares end as the sources' sizes give them).",
    )
    mix_rows: int | None = Field(
        None,
        ge=1,
        description="Rows a mixture draws in all (before duplicates are dropped and rows held out): the first "
        "that many of the draw. Default: all the stopping strategy gives; more than that is an error.",
    )
    system: str | None = Field(None, description="System prompt: text or a template such as '{persona}'.")
    eval_frac: float = Field(0.05, ge=0, lt=1, description="Share of rows held out for evaluation, in [0, 1).")
    seed: int = Field(42, description="Seed of the held-out split (and of a mixture's draw).")
    dedupe: Literal["exact", "near", "off"] = Field(
        "exact",
        description="Drop duplicate rows before the split. exact (or true), the default: rows with the same "
        "prompt turns and the same reply or answer. near: those, then all but the first row of each cluster of "
        "near-duplicate prompts (near_duplicates; rows asking nearly the same thing with other replies go too). "
        "off (or false): keep every row. The counts are in the asset's metadata.",
    )
    near_duplicates: NearDuplicates = Field(
        default_factory=NearDuplicates,
        description="The search for near-duplicate user prompts (MinHash LSH over word n-grams): its clusters "
        "are in the manifest and the asset's metadata; without group_by each stays on one side of the split; "
        "the leak check counts held-out prompts that nearly repeat a training one.",
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
    pii: PiiMode = Field(
        "warn",
        description="What to do with personal data found in the rows (e-mail addresses, phone numbers, card "
        "numbers that pass the Luhn checksum, IP addresses; names are not detected: no offline NER model). warn, "
        "the default: the counts and a few masked examples in the manifest and on the asset, and the "
        "no_personal_data check warns. redact: each piece replaced by a placeholder such as <EMAIL_ADDRESS> "
        "before duplicates are dropped and rows held out, every row kept. block: the check fails as an ERROR "
        "naming the rows, which stops the stages after this one.",
    )

    @field_validator("dedupe", mode="before")
    @classmethod
    def _dedupe_words(cls, value):
        """true and false, as dedupe was a switch before near-duplicates: exact and off."""
        if isinstance(value, bool):
            return "exact" if value else "off"
        if value not in ("exact", "near", "off"):
            raise ValueError(
                f"dedupe must be exact (or true: drop rows repeated word for word), near (near-duplicate prompts "
                f"too) or off (or false), not {value!r}"
            )
        return value

    @model_validator(mode="after")
    def _near_needs_the_search(self):
        if self.dedupe == "near" and not self.near_duplicates.find:
            raise ValueError(
                f"dataset stage {self.name!r}: dedupe: near drops the near-duplicates the search finds, and "
                "near_duplicates.find is false: set it true, or dedupe: exact"
            )
        return self

    @model_validator(mode="after")
    def _one_origin(self):
        given = [f for f in ("source", "path", "sources") if getattr(self, f) is not None]
        if len(given) != 1:
            raise ValueError(
                f"dataset stage {self.name!r} needs exactly one of source (a dataset name), path (a file) or "
                f"sources (a mixture), {'not ' + ' and '.join(given) if given else 'and has none'}"
            )
        if self.sources is None:
            # by value, not by which keys were given: settings written back whole (a job, a manifest) hold both
            fields = type(self).model_fields
            mixing = [f for f in ("mix_rows", "stopping_strategy") if getattr(self, f) != fields[f].default]
            if mixing:
                verb = "go" if len(mixing) > 1 else "goes"
                raise ValueError(f"dataset stage {self.name!r}: {' and '.join(mixing)} {verb} with sources (a mixture)")
            return self
        if len(self.sources) < 2:
            raise ValueError(
                f"dataset stage {self.name!r}: a mixture needs two sources at least; for one, give source or path"
            )
        labels = [s.label for s in self.sources]
        twice = sorted({label for label in labels if labels.count(label) > 1})
        if twice:
            raise ValueError(f"dataset stage {self.name!r}: sources lists {twice} twice; give each source once")
        return self

    def reads(self) -> list[str]:
        if self.sources:
            return [s.source for s in self.sources if s.source]
        return [self.source] if self.source else []

    def check_inputs(self, pipeline) -> None:
        """What it reads are datasets under `datasets:` (a source snapshot), not earlier stages' rows."""
        staged = [name for name in self.reads() if pipeline.stage_or_none(name) is not None]
        if staged:
            raise ValueError(
                f"dataset stage {self.name!r} reads {staged}, which are stages; a dataset stage reads datasets "
                f"under `datasets:` ({sorted(pipeline.datasets)}) or files (path)"
            )

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
        return [
            quality_check(),
            leakage_check(self.allow_leakage, answers_count=self.answers_are_text),
            pii_check(self.pii),
        ]

    def origins(self) -> list[MixSource]:
        """What it reads, as a mixture's sources (one, of weight 1, when it reads a single source or file)."""
        if self.sources:
            return self.sources
        return [MixSource(source=self.source, path=self.path, format=self.format, weight=1)]

    def source_files(self, pipeline) -> list[tuple[str, str | Path, str | None]]:
        """(label, path, format) of each file this stage reads: a source's `datasets:` entry's, else its own.
        A format set on the stage holds for every source that sets none."""
        found = []
        for origin in self.origins():
            entry = pipeline.datasets[origin.source] if origin.source else None
            fmt = origin.format or self.format or (entry.format if entry else None)
            found.append((origin.label, entry.path if entry else origin.path, fmt))
        return found

    def per_row_system(self, pipeline) -> bool:
        """Whether `system` is filled from each row (a column's name, as the mapping reads it, or a {column}
        template) rather than one text for every row."""
        spec = self.system
        if not spec:
            return False
        if "{" in spec or "}" in spec:
            return True
        for _, path, fmt in self.source_files(pipeline):
            try:
                columns = columns_of(path, fmt)
                if spec in (columns if columns is not None else read_table(path, fmt).columns):
                    return True
            except (DataError, OSError, ValueError):  # unreadable here: preflight and the dataset step say why
                continue
        return False

    def one_system(self, pipeline) -> str | None:
        """The system prompt every row of this stage gets: its `system:` text, or the value its column (or
        template) has on every row of the file; None when it has none or the value differs between rows."""
        if not self.per_row_system(pipeline):
            return self.system or None
        try:
            values = {
                render(self.system, record)
                for _, path, fmt in self.source_files(pipeline)
                for record in read_table(path, fmt).to_dict("records")
            }
        except (DataError, OSError, ValueError, KeyError):
            return None
        return values.pop() or None if len(values) == 1 else None

    def preflight(self, pipeline) -> list[str]:
        """Every column this stage's mapping names, checked against each file's header (a missing column fails the
        run before minutes of training, not after). A mixture's problems name the source."""
        found = []
        for label, path, fmt in self.source_files(pipeline):
            columns = columns_of(path, fmt)
            if columns is None:
                continue
            where = f"{self.name}: source {label!r}:" if self.sources else f"{self.name}:"
            found += [p.replace(f"{self.name}:", where, 1) for p in self.layout_problems(columns)]
            for role, spec in self.mapped_columns().items():
                if role == "system" and "{" not in spec:
                    continue  # constant text
                try:
                    missing = [] if spec in columns else [c for c in template_fields(spec) if c not in columns]
                except DataError as exc:
                    found.append(f"{self.name}: {exc}")
                    continue
                if missing:
                    found.append(f"{where} {role} {spec!r} names missing column(s) {missing}; {path} has {columns}")
        return list(dict.fromkeys(found))  # a bad template is one problem, however many sources


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
