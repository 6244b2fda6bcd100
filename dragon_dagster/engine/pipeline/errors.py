"""Pydantic's errors as a pipeline's problems: each named by its field (the unions' tags left out) and, when the
YAML is known, its line. Both the YAML's reading (loading.py) and the pipeline's own checks of per-run overrides
(definition.py) describe errors this way."""

from __future__ import annotations

from pydantic import ValidationError

from .. import catalog
from ..rewards import REWARD_TYPES


def describe(exc: ValidationError, lines: dict[tuple, int] | None = None) -> str:
    """Pydantic's errors as 'stages[1].args.learning_rate (line 12): Input should be ...', joined by '; '."""
    out = []
    tags = set(catalog.KINDS) | set(REWARD_TYPES) | {"function-after", "function-before"}
    for error in exc.errors():
        loc = [p for p in error["loc"] if not (isinstance(p, str) and p in tags)]  # drop the unions' tags
        field = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".") or "pipeline"
        line = _line_of(lines or {}, tuple(loc))
        got = (
            f" (got {error['input']!r})"
            if error["type"] not in ("missing", "extra_forbidden") and not isinstance(error.get("input"), (dict, list))
            else ""
        )
        message = "unknown field" if error["type"] == "extra_forbidden" else error["msg"]
        out.append(f"{field}{f' (line {line})' if line else ''}: {message}{got}")
    return "; ".join(out)


def _line_of(lines: dict[tuple, int], loc: tuple) -> int | None:
    while loc and loc not in lines:
        loc = loc[:-1]
    return lines.get(loc)
