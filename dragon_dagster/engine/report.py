"""The evaluation report: base model against the merged model on the same held-out rows."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from . import progress
from .data import read_jsonl
from .evaluate import evaluate_rows
from .models import load_model, load_tokenizer
from .reporting import Reporter
from .settings import Hardware, build


@dataclass
class ReportJob:
    base_model: str
    merged_model: str
    eval_file: str
    output_dir: str
    train_file: str | None = None
    stages: list[dict] = field(default_factory=list)   # [{"name", "dir"}] of adapters, for the loss curve
    hardware: dict = field(default_factory=dict)
    n_samples: int = 5
    max_eval_rows: int = 50
    max_new_tokens: int = 128
    max_len: int = 1024


def evaluate_report(job: ReportJob, reporter: Reporter) -> dict:
    hardware = build(Hardware, job.hardware, "hardware")
    rows = read_jsonl(job.eval_file) if Path(job.eval_file).exists() else []
    held_out = bool(rows)
    if not rows and job.train_file:
        rows = read_jsonl(job.train_file)[: job.max_eval_rows]
    if not rows:
        raise ValueError(f"no rows to evaluate on in {job.eval_file}")
    rows = rows[: job.max_eval_rows]
    results = {}
    for name, path in (("base", job.base_model), ("merged", job.merged_model)):
        reporter.log(f"evaluating the {name} model on {len(rows)} {'held-out' if held_out else 'training'} rows")
        tokenizer = load_tokenizer(path)
        model = load_model(path, hardware)
        results[name] = evaluate_rows(model, tokenizer, rows, n_samples=None, max_new_tokens=job.max_new_tokens,
                                      max_len=job.max_len)
        del model
    out = Path(job.output_dir)
    curves = [(s["name"], progress.read(s["dir"])) for s in job.stages]
    plot = _plot(curves, out / "loss.png")
    report = {
        "held_out": held_out, "rows": len(rows),
        "base": {k: v for k, v in results["base"].items() if k != "samples"},
        "merged": {k: v for k, v in results["merged"].items() if k != "samples"},
        "merged_not_worse": _not_worse(results["base"]["eval_loss"], results["merged"]["eval_loss"]),
        "samples": [{"prompt": b["prompt"], "reference": b["reference"], "base": b["generated"],
                     "merged": m["generated"]} for b, m in zip(results["base"]["samples"][: job.n_samples],
                                                               results["merged"]["samples"][: job.n_samples])],
        "loss_plot": str(plot) if plot else None,
    }
    (out / "report.json").write_text(json.dumps(report, indent=2, ensure_ascii=False))
    (out / "report.md").write_text(markdown(report))
    return report


def _not_worse(base: float, merged: float) -> bool:
    return math.isfinite(merged) and (not math.isfinite(base) or merged <= base + 1e-6)


def _plot(curves: list[tuple[str, list[dict]]], out: Path) -> Path | None:
    rows, offset = [], 0
    for _, progress_rows in curves:  # stages one after another on one step axis
        steps = [r for r in progress_rows if isinstance(r.get("loss"), (int, float))]
        rows += [{**r, "step": r["step"] + offset} for r in steps]
        offset += max((r["step"] for r in steps), default=0)
    return progress.plot_loss(rows, out, title=" -> ".join(n for n, _ in curves) + " training loss")


def _fmt(value) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def markdown(report: dict) -> str:
    base, merged = report["base"], report["merged"]
    names = ["eval_loss", "perplexity"] + list(base.get("metrics", {}))
    lines = ["# Evaluation report", "",
             f"{report['rows']} {'held-out' if report['held_out'] else 'training'} rows, base model against merged model.",
             "", "| metric | base | merged |", "|---|---|---|"]
    for name in names:
        b = base.get(name, base.get("metrics", {}).get(name))
        m = merged.get(name, merged.get("metrics", {}).get(name))
        lines.append(f"| {name} | {_fmt(b)} | {_fmt(m)} |")
    verdict = "not worse than" if report["merged_not_worse"] else "WORSE than"
    lines += ["", f"The merged model is **{verdict}** the base model on held-out loss.", "", "## Samples", ""]
    for i, s in enumerate(report["samples"], 1):
        lines += [f"### {i}. {' '.join(s['prompt'].split())[:80]}", "", "| reference | base | merged |", "|---|---|---|",
                  "| " + " | ".join(_cell(s[k]) for k in ("reference", "base", "merged")) + " |", ""]
    return "\n".join(lines)


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", "<br>")[:600]
