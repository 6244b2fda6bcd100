"""Task metrics for generated replies, as dragon_metrics() defines them: one number per row, no judge model.

The metrics themselves are text matchers (text/matchers.py); here they are looked up by name and averaged.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from statistics import mean

from ..text.matchers import MATCHERS

METRICS = MATCHERS


def metric_regex(pattern: str, ignore_case: bool = True) -> Callable[[str, str, str], float]:
    compiled = re.compile(pattern, re.I if ignore_case else 0)
    return lambda generated, reference="", prompt="": float(bool(compiled.search(str(generated))))


def score(
    generated: list[str], references: list[str], prompts: list[str] | None = None, names: list[str] | None = None
) -> dict[str, float]:
    """Mean of each named metric over the rows."""
    unknown = sorted(set(names or []) - set(METRICS))
    if unknown:
        raise ValueError(f"unknown metric(s) {unknown}; known: {sorted(METRICS)}")
    prompts = prompts or [""] * len(generated)
    out = {}
    for name in names or list(METRICS):
        values = [METRICS[name](g, r, p) for g, r, p in zip(generated, references, prompts)]
        out[name] = round(mean(values), 4) if values else float("nan")
    return out
