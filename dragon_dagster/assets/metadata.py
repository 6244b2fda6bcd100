"""Metadata helpers: small Markdown tables and MLflow links for the asset pages."""

from __future__ import annotations

import math
import statistics

from dagster import MetadataValue


def md_table(rows: list[dict], columns: list[str] | None = None, width: int = 160) -> MetadataValue:
    if not rows:
        return MetadataValue.md("_no rows_")
    columns = columns or list(rows[0])

    def cell(value) -> str:
        text = str(value).replace("|", "\\|").replace("\n", "<br>")
        return text if len(text) <= width else text[: width - 1] + "…"

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(c, "")) for c in columns) + " |" for r in rows]
    return MetadataValue.md("\n".join(lines))


def length_stats(lengths: list[int]) -> dict:
    if not lengths:
        return {}
    ordered = sorted(lengths)
    return {
        "min": ordered[0],
        "mean": round(statistics.mean(ordered), 1),
        "p95": ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)],
        "max": ordered[-1],
    }


def finite(values: dict) -> dict:
    """Only the numbers Dagster can show (drops None and NaN)."""
    return {k: float(v) for k, v in values.items() if isinstance(v, (int, float)) and math.isfinite(v)}
