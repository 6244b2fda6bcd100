"""The evaluation report: base model against the merged model on the same held-out rows."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from ..train import progress
from ..data.tables import read_jsonl
from .replies import evaluate_rows
from ..models import load_model, load_tokenizer
from ..reporter import Reporter
from ..spec.settings import Hardware, build
from ..spec.stages import Evaluate


@dataclass
class ReportJob:
    settings: Evaluate
    base_model: str
    merged_model: str
    eval_file: str
    output_dir: str
    train_file: str | None = None
    stages: list[dict] = field(default_factory=list)   # [{"name", "dir"}] of adapters, for the loss curve
    hardware: dict = field(default_factory=dict)
    max_len: int = 1024
    stage_results: list[dict] = field(default_factory=list)  # [{"name", "method", "result"}] from manifests
    first_stage_adapters: list[str] = field(default_factory=list)  # the model after the first stage


def evaluate_report(job: ReportJob, reporter: Reporter) -> dict:
    hardware = build(Hardware, job.hardware, "hardware")
    rows = read_jsonl(job.eval_file) if Path(job.eval_file).exists() else []
    held_out = bool(rows)
    if not rows and job.train_file:
        rows = read_jsonl(job.train_file)[: job.settings.max_eval_rows]
    if not rows:
        raise ValueError(f"no rows to evaluate on in {job.eval_file}")
    rows = rows[: job.settings.max_eval_rows]
    results = {}
    for name, path in (("base", job.base_model), ("merged", job.merged_model)):
        reporter.log(f"evaluating the {name} model on {len(rows)} {'held-out' if held_out else 'training'} rows")
        tokenizer = load_tokenizer(path)
        model = load_model(path, hardware)
        results[name] = evaluate_rows(model, tokenizer, rows, n_samples=None, max_new_tokens=job.settings.max_new_tokens,
                                      max_len=job.max_len)
        del model
    out = Path(job.output_dir)
    judged = pairwise(job, rows, results, hardware, reporter) if job.settings.n_judge > 0 else {}
    curves = [(s["name"], progress.read(s["dir"])) for s in job.stages]
    plot = _plot(curves, out / "loss.png")
    report = {
        "held_out": held_out, "rows": len(rows),
        "base": {k: v for k, v in results["base"].items() if k != "samples"},
        "merged": {k: v for k, v in results["merged"].items() if k != "samples"},
        "merged_not_worse": _not_worse(results["base"]["eval_loss"], results["merged"]["eval_loss"]),
        "stages": stage_figures(job.stage_results), "judge": judged,
        "samples": [{"prompt": b["prompt"], "reference": b["reference"], "base": b["generated"],
                     "merged": m["generated"]} for b, m in zip(results["base"]["samples"][: job.settings.n_samples],
                                                               results["merged"]["samples"][: job.settings.n_samples])],
        "loss_plot": str(plot) if plot else None,
    }
    (out / "report.json").write_text(json.dumps(report, indent=2, ensure_ascii=False))
    (out / "report.md").write_text(markdown(report))
    return report


def stage_figures(stage_results: list[dict]) -> list[dict]:
    """Each stage's own held-out figures: loss for SFT, preference accuracy for DPO/ORPO, reward for GRPO."""
    keys = ("eval_loss", "perplexity", "pref_accuracy", "reward_margin", "reward_before", "reward_after")
    return [{"stage": s["name"], "method": s.get("method"), **{k: s["result"].get(k) for k in keys
                                                              if s["result"].get(k) is not None}}
            for s in stage_results]


def pairwise(job: ReportJob, rows: list[dict], results: dict, hardware: Hardware, reporter: Reporter) -> dict:
    """The merged model judged against the base and against the first stage, each prompt in both orders."""
    from ..infer.backends import LocalBackend, as_backend
    from .replies import generate
    from .judge import Judge

    backend = as_backend(job.settings.judge) if job.settings.judge else LocalBackend(job.base_model, device=hardware.device,
                                                                   dtype=hardware.dtype)
    judge = Judge(backend, cache_path=Path(job.output_dir) / "judge_cache.sqlite", max_new_tokens=96)
    sample = rows[: job.settings.n_judge]
    n = len(sample)
    prompts = [r["prompt"] for r in sample]
    references = [s["reference"] for s in results["merged"]["samples"][:n]]
    merged = [s["generated"] for s in results["merged"]["samples"][:n]]
    base = [s["generated"] for s in results["base"]["samples"][:n]]
    reporter.log(f"judging merged against base on {n} prompts (both orders) with {backend!r}")
    out = {"judge": repr(backend), "vs_base": judge.compare(prompts, merged, base, references).summary()}
    if job.first_stage_adapters:
        tokenizer = load_tokenizer(job.base_model)
        model = load_model(job.base_model, hardware, adapters=job.first_stage_adapters)
        first = generate(model, tokenizer, prompts, max_new_tokens=job.settings.max_new_tokens)
        out["vs_first_stage"] = judge.compare(prompts, merged, first, references).summary()
    return out


def _not_worse(base: float, merged: float) -> bool:
    return math.isfinite(merged) and (not math.isfinite(base) or merged <= base + 1e-6)


def _plot(curves: list[tuple[str, list[dict]]], out: Path) -> Path | None:
    rows, offset = [], 0
    for _, progress_rows in curves:  # stages one after another on one step axis
        steps = [r for r in progress_rows if isinstance(r.get("loss"), (int, float))]
        rows += [{**r, "step": r["step"] + offset} for r in steps]
        offset += max((r["step"] for r in steps), default=0)
    return progress.plot_loss(rows, out, title=" -> ".join(n for n, _ in curves) + " training loss",
                              extra="reward")  # GRPO stages: mean reward beside the loss


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
    lines += ["", f"The merged model is **{verdict}** the base model on held-out loss.", ""]
    if report.get("stages"):
        columns = sorted({k for s in report["stages"] for k in s} - {"stage", "method"})
        lines += ["## Stages", "", "| stage | method | " + " | ".join(columns) + " |", "|---|---|" + "---|" * len(columns)]
        lines += [f"| {s['stage']} | {s.get('method')} | " + " | ".join(_fmt(s.get(c, "")) for c in columns) + " |"
                  for s in report["stages"]]
        lines.append("")
    if report.get("judge"):
        lines += ["## Pairwise judge (merged model as A, each prompt judged in both orders)", "",
                  f"Judge: {report['judge']['judge']}", "", "| against | wins | ties | losses | unparsed | "
                  "disagreements | win rate |", "|---|---|---|---|---|---|---|"]
        for name in ("vs_base", "vs_first_stage"):
            if name in report["judge"]:
                j = report["judge"][name]
                lines.append(f"| {name[3:]} | {j['wins']} | {j['ties']} | {j['losses']} | {j['unparsed']} | "
                             f"{j['disagreements']} | {_fmt(j['win_rate'])} |")
        lines.append("")
    lines += ["## Samples", ""]
    for i, s in enumerate(report["samples"], 1):
        lines += [f"### {i}. {' '.join(s['prompt'].split())[:80]}", "", "| reference | base | merged |", "|---|---|---|",
                  "| " + " | ".join(_cell(s[k]) for k in ("reference", "base", "merged")) + " |", ""]
    return "\n".join(lines)


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", "<br>")[:600]
