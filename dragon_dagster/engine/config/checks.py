"""Asset checks as plain data: a kind names the checks its artifact gets and how each is judged from the artifact
directory; the Dagster layer turns each into an asset check (assets/checks.py). Framework-free, so a check's
judgement runs the same in a test or a notebook."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal


@dataclass(frozen=True)
class Promotion:
    """A passing check that makes a merged model the registry's champion (the evaluation report's)."""

    merged_dir: str
    reason: str


@dataclass(frozen=True)
class CheckOutcome:
    """A check's verdict. description: for a failure, one line saying why and which setting fixes it (required:
    the Dagster UI shows it with the check, `dragon demo` prints it after the verdict); the figures go in
    metadata."""

    passed: bool
    metadata: dict[str, Any] = field(default_factory=dict)
    description: str | None = None
    severity: Literal["warn", "error"] = "warn"
    promote: Promotion | None = None

    def __post_init__(self) -> None:
        if not self.passed and not (self.description or "").strip():
            raise ValueError("a failed check outcome needs a description: why it failed and what setting fixes it")


@dataclass(frozen=True)
class CheckSpec:
    """One check of a stage's artifact: judge(artifact_dir) decides it. blocking: a failure (severity error)
    stops the stages after this one in the same run. promotes: a passing outcome may name a merged model to
    make the champion (the check then needs the model registry)."""

    name: str
    description: str
    judge: Callable[[Path], CheckOutcome]
    blocking: bool = False
    promotes: bool = False
