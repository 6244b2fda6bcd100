"""Progress rows (one per logged step) and the loss plot people look at."""

from __future__ import annotations

import json
import math
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


def plot_loss(rows: list[dict], out: Path, title: str = "training loss", extra: str | None = None) -> Path | None:
    """A PNG of loss by step (and an extra column such as mean reward on a second axis)."""
    points = [(r["step"], r["loss"]) for r in rows if isinstance(r.get("loss"), (int, float)) and math.isfinite(r["loss"])]
    if not points:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    ax.plot(*zip(*points), marker="o", markersize=3, label="train loss")
    evals = [(r["step"], r["eval_loss"]) for r in rows if isinstance(r.get("eval_loss"), (int, float))]
    if evals:
        ax.plot(*zip(*evals), marker="s", linestyle="--", label="eval loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    if extra:
        series = [(r["step"], r[extra]) for r in rows if isinstance(r.get(extra), (int, float))]
        if series:
            ax2 = ax.twinx()
            ax2.plot(*zip(*series), color="tab:green", label=extra)
            ax2.set_ylabel(extra)
    ax.set_title(title)
    ax.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return Path(out)
