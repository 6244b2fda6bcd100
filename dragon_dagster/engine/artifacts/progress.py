"""Progress rows: progress.jsonl, one row per logged training step (the loss plots are evaluate/plots.py)."""

from __future__ import annotations

import json
from pathlib import Path

PROGRESS = "progress.jsonl"


def append(directory: Path, row: dict) -> None:
    with (Path(directory) / PROGRESS).open("a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")


def write(directory: Path, rows: list[dict]) -> None:
    """Start progress.jsonl afresh with rows (a resumed run's history); later steps append."""
    (Path(directory) / PROGRESS).write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


def read(directory: str | Path) -> list[dict]:
    path = Path(directory) / PROGRESS
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
