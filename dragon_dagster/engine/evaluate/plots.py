"""The plots people look at: a stage's loss curve (with its mean reward), the report's curve of every stage, and
the held-out NLL along the chain with each model named."""

from __future__ import annotations

import math
from pathlib import Path


def plot_loss(rows: list[dict], out: Path, title: str = "training loss", extra: str | None = None) -> Path | None:
    """A PNG of loss by step (and an extra column such as mean reward on a second axis)."""
    points = [
        (r["step"], r["loss"]) for r in rows if isinstance(r.get("loss"), (int, float)) and math.isfinite(r["loss"])
    ]
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
    series = []
    if extra:
        series = [(r["step"], r[extra]) for r in rows if isinstance(r.get(extra), (int, float))]
        # the held-out figure scored while training (eval_every), beside the training one: GRPO's eval_reward
        held = [(r["step"], r[f"eval_{extra}"]) for r in rows if isinstance(r.get(f"eval_{extra}"), (int, float))]
        if series:
            ax2 = ax.twinx()
            ax2.plot(*zip(*series), color="tab:green", label=extra)
            if held:
                ax2.plot(*zip(*held), color="tab:olive", marker="s", linestyle="--", label=f"held-out {extra}")
            ax2.set_ylabel(extra)
    ax.set_title(title)
    _legend(ax, ax2 if series else None)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return Path(out)


def plot_stages(curves: list[tuple[str, str, list[dict]]], out: Path) -> Path | None:
    """One panel per stage (name, what its loss measures, progress rows): each stage's own objective on its own
    axis, since a preference loss and an SFT loss are not on one scale; a stage's mean reward (where it logged
    one) beside its loss, labelled."""
    curves = [
        (n, m, [r for r in rows if isinstance(r.get("loss"), (int, float)) and math.isfinite(r["loss"])], rows)
        for n, m, rows in curves
    ]
    curves = [c for c in curves if c[2]]
    if not curves:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(curves), figsize=(4.2 * len(curves), 3.4), dpi=100, squeeze=False)
    for ax, (name, label, losses, rows) in zip(axes[0], curves):
        ax.plot([r["step"] for r in losses], [r["loss"] for r in losses], marker="o", markersize=3, label=label)
        ax.set_xlabel("step")
        ax.set_ylabel(label)
        ax.set_title(name)
        rewards = [(r["step"], r["reward"]) for r in rows if isinstance(r.get("reward"), (int, float))]
        twin = None
        if rewards:
            twin = ax.twinx()
            twin.plot(*zip(*rewards), color="tab:green", label="mean reward")
            twin.set_ylabel("mean reward")
        _legend(ax, twin)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return Path(out)


def plot_chain(figures: list[dict], out: Path, metric: str = "heldout/nll") -> Path | None:
    """The held-out figure `metric` of every model along the chain (ReportResult.held_out_figures: base, the model
    after each stage, merged), each point named by its model: MLflow's own chart of the same series can number its
    steps only. Sized to read in MLflow's chart card."""
    points = [(f["model"], f["metrics"][metric]) for f in figures if isinstance(f["metrics"].get(metric), (int, float))]
    points = [(name, value) for name, value in points if math.isfinite(value)]
    if len(points) < 2:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names, values = zip(*points)
    fig, ax = plt.subplots(figsize=(max(4.5, 1.3 * len(points)), 3.6), dpi=100)
    ax.plot(range(len(values)), values, marker="o", markersize=7, linewidth=2)
    for x, value in enumerate(values):
        ax.annotate(f"{value:.3f}", (x, value), textcoords="offset points", xytext=(0, 8), ha="center", fontsize=11)
    ax.set_xticks(range(len(names)), [name.removesuffix("_adapter") for name in names], fontsize=11)
    ax.set_xlim(-0.4, len(values) - 0.6)
    low, high = min(values), max(values)
    pad = (high - low) * 0.25 or abs(high) * 0.05 or 0.1
    ax.set_ylim(low - pad, high + pad)
    ax.set_ylabel(metric, fontsize=11)
    ax.set_title(f"{metric} along the chain (lower is better)" if metric.endswith("nll") else metric, fontsize=12)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return Path(out)


def plot_reward_scores(chosen: list[float], rejected: list[float], out: Path, title: str) -> Path | None:
    """Histograms of a reward model's scores on held-out chosen and rejected replies: the further apart, the
    surer it ranks; overlap is where it ranks by chance."""
    if not chosen and not rejected:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    every = chosen + rejected
    low, high = min(every), max(every)
    bins = [low + (high - low) * i / 20 for i in range(21)] if high > low else 10
    ax.hist(chosen, bins=bins, alpha=0.6, color="tab:green", label=f"chosen ({len(chosen)})")
    ax.hist(rejected, bins=bins, alpha=0.6, color="tab:red", label=f"rejected ({len(rejected)})")
    ax.set_xlabel("reward model score")
    ax.set_ylabel("held-out replies")
    ax.set_title(title)
    ax.legend(loc="upper right", fontsize="small")
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return Path(out)


def _legend(ax, twin=None) -> None:
    """One legend for both axes, so a second-axis line is named too."""
    handles, labels = ax.get_legend_handles_labels()
    if twin is not None:
        more = twin.get_legend_handles_labels()
        handles, labels = handles + more[0], labels + more[1]
    ax.legend(handles, labels, loc="upper right", fontsize="small")
