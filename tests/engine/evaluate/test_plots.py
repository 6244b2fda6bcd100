"""The held-out chain plot: each model named on its axis, its value written at its point; no plot without two
finite points."""

from __future__ import annotations

import math

from dragon_dagster.engine.evaluate.plots import plot_chain


def figures(*pairs):
    return [
        {"model": name, "metrics": {"heldout/nll": value, "heldout/perplexity": math.exp(value)}}
        for name, value in pairs
    ]


def test_the_chain_plot_names_each_model_and_writes_its_value(tmp_path, monkeypatch):
    import matplotlib.axes

    labels, notes = [], []
    real_ticks, real_note = matplotlib.axes.Axes.set_xticks, matplotlib.axes.Axes.annotate
    monkeypatch.setattr(
        matplotlib.axes.Axes,
        "set_xticks",
        lambda self, ticks, names=None, **kw: (labels.extend(names or []), real_ticks(self, ticks, names, **kw))[1],
    )
    monkeypatch.setattr(
        matplotlib.axes.Axes,
        "annotate",
        lambda self, text, *a, **kw: (notes.append(text), real_note(self, text, *a, **kw))[1],
    )
    out = plot_chain(
        figures(("base", 2.5), ("sft_adapter", 1.75), ("dpo_adapter", 1.8), ("merged", 1.8)), tmp_path / "c.png"
    )
    assert out == tmp_path / "c.png" and out.read_bytes().startswith(b"\x89PNG")
    assert labels == ["base", "sft", "dpo", "merged"]
    assert notes == ["2.500", "1.750", "1.800", "1.800"]


def test_no_chain_plot_without_two_finite_points(tmp_path):
    assert plot_chain(figures(("base", 2.5)), tmp_path / "a.png") is None
    assert plot_chain(figures(("base", 2.5), ("merged", float("nan"))), tmp_path / "b.png") is None
    assert (
        plot_chain([{"model": "base", "metrics": {}}, {"model": "merged", "metrics": {}}], tmp_path / "c.png") is None
    )
    assert not list(tmp_path.iterdir())
