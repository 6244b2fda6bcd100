"""What an asset's page shows: small Markdown tables, token-length stats, and a result's metadata (engine values:
numbers, text, Markdown, rows, paths) as Dagster metadata values."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from dagster import MetadataValue

from ..engine.artifacts.manifest import PiiReport
from ..engine.config.results import Markdown, finite


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


def pii_metadata(report: PiiReport | None) -> dict:
    """The personal-data scan on the asset: counts by type (plotted run over run), masked examples."""
    if report is None:
        return {}
    return {
        "pii_rows": report.rows_with_pii,
        **{f"pii_{entity.lower()}": n for entity, n in report.counts.items()},
        **({"pii_redacted": report.redacted} if report.mode == "redact" else {}),
        **(
            {"pii_examples": md_table([f.model_dump(exclude_none=True) for f in report.findings[:5]])}
            if report.findings
            else {}
        ),
        "pii_not_detected": ", ".join(report.not_detected),
        "pii_scan_seconds": report.seconds,
    }


def log_pii(context, name: str, report: PiiReport | None) -> None:
    """One line in the run's log when personal data was found: how much, what the stage does, a masked example."""
    if report is None or not report.rows_with_pii:
        return
    found = ", ".join(f"{n} {entity}" for entity, n in report.counts.items())
    done = {
        "warn": "kept as is (pii: warn)",
        "redact": "replaced by placeholders (pii: redact)",
        "block": "the no_personal_data check blocks the stages after it (pii: block)",
    }[report.mode]
    first = report.findings[0]
    context.log.warning(
        f"{name}: personal data in {report.rows_with_pii} of {report.rows_scanned} {report.unit}s ({found}), "
        f"{done}; e.g. {report.unit} {first.row}: {first.entity} in {first.snippet!r}"
    )


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


def shown(value: float) -> float:
    """A float as people read it: six significant digits (0.35, not 0.35000000000000003). The artifact's JSON
    and MLflow keep full precision; this is only what the asset page displays."""
    return float(f"{value:.6g}")


def image_markdown(name: str, path: Path, alt: str) -> dict[str, MetadataValue]:
    """A PNG embedded in the asset page as Markdown ({name: ...}; {} when there is no such file): Dagster has no
    image metadata type, and its Markdown renders data: URIs, so the plot is where people look."""
    import base64

    path = Path(path)
    if not path.is_file():
        return {}
    data = base64.b64encode(path.read_bytes()).decode()
    return {name: MetadataValue.md(f"![{alt}](data:image/png;base64,{data})")}


def as_metadata(values: dict[str, Any]) -> dict[str, Any]:
    """A result's metadata for Dagster: Markdown rendered, rows as a table, paths as paths, numbers only when
    finite (None and NaN are left out) and floats rounded for display, dicts as JSON, other text as text."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, Markdown):
            out[key] = MetadataValue.md(value)
        elif isinstance(value, Path):
            out[key] = MetadataValue.path(str(value))
        elif isinstance(value, list) and all(isinstance(v, dict) for v in value):
            out[key] = md_table(value)
        elif isinstance(value, dict):
            out[key] = MetadataValue.json(value)
        elif isinstance(value, bool):
            out[key] = value
        elif isinstance(value, (int, float)):
            if isinstance(value, float):
                out.update({k: shown(v) for k, v in finite({key: value}).items()})
            else:
                out[key] = value
        elif isinstance(value, str):
            out[key] = MetadataValue.text(value)
    return out


__all__ = ["as_metadata", "finite", "image_markdown", "length_stats", "md_table", "shown"]
