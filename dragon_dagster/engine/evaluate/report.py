"""The evaluation report: base model against the merged model on the same held-out rows."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from ..data.tables import read_jsonl
from ..models import load_model, load_tokenizer
from ..reporter import Reporter
from ..rewards import ACCURACY_TYPES, Reward, RewardSet
from ..spec.settings import Hardware, build
from ..spec.stages import Evaluate
from ..train import progress
from .feedback_gain import gain, held_out_feedback, model_figures
from .replies import completion_loss, evaluate_rows, has_replies, score_prompt_rows


@dataclass
class ReportJob:
    settings: Evaluate
    base_model: str
    merged_model: str
    eval_file: str
    output_dir: str
    train_file: str | None = None
    stages: list[dict] = field(default_factory=list)  # [{"name", "dir"}] of adapters, for the loss curve
    hardware: dict = field(default_factory=dict)
    max_len: int = 1024
    stage_results: list[dict] = field(default_factory=list)  # [{"name", "method", "result"}] from manifests
    first_stage_adapters: list[str] = field(default_factory=list)  # the model after the first stage
    rewards: list[dict] = field(default_factory=list)  # [{"name", "dir", "rewards"}] of the chain's GRPO stages
    # a retraining from feedback: {"held_out": {objective: eval file}, "taste": rewards or None, "liked_at",
    # "objectives": [what each objective trained on, or why it was skipped]}
    feedback: dict = field(default_factory=dict)


def evaluate_report(job: ReportJob, reporter: Reporter) -> dict:
    hardware = build(Hardware, job.hardware, "hardware")
    rows = read_jsonl(job.eval_file) if Path(job.eval_file).exists() else []
    held_out = bool(rows)
    if not rows and job.train_file:
        rows = read_jsonl(job.train_file)[: job.settings.max_eval_rows]
    if not rows:
        raise ValueError(f"no rows to evaluate on in {job.eval_file}")
    rows = rows[: job.settings.max_eval_rows]
    prompts_only = not has_replies(rows)  # a prompt dataset: no reference replies, so no loss
    rewards, reward_specs = reward_set(job.rewards) if prompts_only else (None, [])
    split = "held-out" if held_out else "training"
    results, feedback_raw = {}, {}
    rated, pairs, taste = held_out_feedback_of(job)
    for name, path in (("base", job.base_model), ("merged", job.merged_model)):
        reporter.log(f"evaluating the {name} model on {len(rows)} {split} {'prompts' if prompts_only else 'rows'}")
        tokenizer = load_tokenizer(path)
        model = load_model(path, hardware)
        if prompts_only:
            results[name] = score_prompt_rows(
                model,
                tokenizer,
                rows,
                rewards,
                max_new_tokens=job.settings.max_new_tokens,
                metric_names=job.settings.metrics,
            )
        else:
            results[name] = evaluate_rows(
                model,
                tokenizer,
                rows,
                n_samples=None,
                max_new_tokens=job.settings.max_new_tokens,
                max_len=job.max_len,
                metric_names=job.settings.metrics,
            )
        if job.feedback:
            reporter.log(f"the {name} model on the held-out feedback: {len(rated)} rated replies, {len(pairs)} pairs")
            feedback_raw[name] = model_figures(
                model, tokenizer, rated, pairs, taste, max_len=job.max_len, max_new_tokens=job.settings.max_new_tokens
            )
        del model
    out = Path(job.output_dir)
    judged = pairwise(job, rows, results, hardware, reporter) if job.settings.n_judge > 0 else {}
    methods = {s["name"]: s.get("method") for s in job.stage_results}
    curves = [(s["name"], methods.get(s["name"]) or "sft", progress.read(s["dir"])) for s in job.stages]
    plot = _plot(curves, out / "loss.png")
    n_samples = min(job.settings.n_samples, len(rows))
    samples = [
        {"prompt": b["prompt"], "reference": b["reference"], "base": b["generated"], "merged": m["generated"]}
        for b, m in zip(results["base"]["samples"][:n_samples], results["merged"]["samples"][:n_samples])
    ]
    report = {
        "task": "prompts" if prompts_only else "chat",
        "held_out": held_out,
        "rows": len(rows),
        "metrics": list(results["base"]["metrics"]),
        "metrics_chosen_by": "pipeline" if job.settings.metrics else "references",
    }
    if prompts_only:
        if rewards is not None:
            for sample, b, m in zip(samples, results["base"]["samples"], results["merged"]["samples"]):
                sample.update(base_reward=b["reward"], merged_reward=m["reward"])
        not_worse, basis = _prompts_not_worse(results["base"], results["merged"])
        report.update(
            computed_on=_prompts_computed_on(
                job, len(rows), split, reward_specs, bool(results["base"]["metrics"]), n_samples
            ),
            rewards=reward_specs,
            not_worse_on=basis,
        )
    else:
        not_worse = _not_worse(results["base"]["eval_loss"], results["merged"]["eval_loss"])
        report["stage_nll"] = stage_nll(job, rows, results, hardware, reporter) if len(job.stages) > 1 else []
        report["computed_on"] = {
            "rows": len(rows),
            "split": split,
            "loss": f"the reference replies of {len(rows)} {split} rows (reply tokens only)",
            "metrics": f"all {len(rows)} {split} rows: greedy replies against their reference replies (an "
            "adapter's metrics.json is on its first n_samples rows only)",
            "samples": f"the first {n_samples} of those rows",
        }
    if job.feedback:
        report["feedback"] = gain(
            feedback_raw["base"], feedback_raw["merged"], rated, pairs, job.feedback.get("liked_at", 1.0)
        )
        report["objectives"] = job.feedback.get("objectives", [])
        if "taste_samples" in feedback_raw["base"]:
            report["feedback"]["taste_samples"] = [
                {"prompt": b["prompt"], "start": b["reply"], "retrained": m["reply"]}
                for b, m in zip(feedback_raw["base"]["taste_samples"], feedback_raw["merged"]["taste_samples"])
            ][:n_samples]
    report.update(
        {
            "base": {k: v for k, v in results["base"].items() if k != "samples"},
            "merged": {k: v for k, v in results["merged"].items() if k != "samples"},
            "merged_not_worse": not_worse,
            "stages": stage_figures(job.stage_results),
            "judge": judged,
            "samples": samples,
            "loss_plot": plot.relative_to(out).as_posix() if plot else None,  # relative: the staging dir is renamed
        }
    )
    (out / "report.json").write_text(json.dumps(report, indent=2, ensure_ascii=False))
    (out / "report.md").write_text(markdown(report))
    return report


def held_out_feedback_of(job: ReportJob):
    """(rated replies, pairs, taste RewardSet or None) a retraining's report measures; empty otherwise."""
    if not job.feedback:
        return [], [], None
    # relative to the report's own directory, where the asset copied them
    rated, pairs = held_out_feedback({o: str(Path(job.output_dir) / f) for o, f in job.feedback["held_out"].items()})
    taste = job.feedback.get("taste")
    return rated, pairs, RewardSet.from_list(taste, base_dir=job.output_dir) if taste else None


def reward_set(stages: list[dict]) -> tuple[RewardSet | None, list[dict]]:
    """The rewards of the GRPO stages in the merged model's chain, from their manifests' settings: a custom
    reward's file is relative to its stage's artifact dir (it was copied into rewards/ there). A later stage's
    reward of the same name replaces an earlier one's. (None, []) when the chain has no GRPO stage."""
    rewards: dict[str, Reward] = {}
    specs: dict[str, dict] = {}
    for stage in stages:
        for spec in stage.get("rewards") or []:
            reward = Reward.from_dict(spec, base_dir=stage["dir"])
            rewards[reward.name] = reward
            specs[reward.name] = {
                "name": reward.name,
                "type": reward.type,
                "weight": reward.weight,
                "stage": stage.get("name"),
                "accuracy_like": reward.type in ACCURACY_TYPES,
            }
    return (RewardSet(list(rewards.values())) if rewards else None), list(specs.values())


def _prompts_computed_on(
    job: ReportJob, n: int, split: str, reward_specs: list[dict], has_metrics: bool, n_samples: int
) -> dict:
    replies = (
        f"greedy replies of the base and the merged model to {n} {split} prompts "
        f"(at most {job.settings.max_new_tokens} new tokens)"
    )
    stages = sorted({s["stage"] for s in reward_specs if s.get("stage")})
    return {
        "rows": n,
        "split": split,
        "rewards": f"{replies}, scored with the rewards of {', '.join(stages) or 'the GRPO stages'}; accuracy: the "
        "share of those prompts scoring 1 on an accuracy-like reward"
        if reward_specs
        else "absent: no GRPO stage in the merged model's chain",
        "metrics": f"all {n} {split} prompts: the same replies against their reference answers"
        if has_metrics
        else "absent: the rows have no reference answers",
        "loss": "absent (the rows are prompts without reference replies)",
        "samples": f"the first {n_samples} of those prompts",
    }


TASK_SCORES = ("exact", "contains", "numeric", "token_f1")  # task metrics where higher is better


def _prompts_not_worse(base: dict, merged: dict, tolerance: float = 1e-6) -> tuple[bool | None, str | None]:
    """On prompts: the weighted reward (merged >= base - tolerance); without rewards, the mean of the task
    metrics where higher is better; None when neither was measured."""
    if "reward" in base:
        return bool(merged["reward"] >= base["reward"] - tolerance), "weighted reward"
    names = [n for n in TASK_SCORES if n in base.get("metrics", {})]
    if names:
        score = lambda figures: sum(figures["metrics"][n] for n in names) / len(names)  # noqa: E731
        return bool(score(merged) >= score(base) - tolerance), "task metrics (" + ", ".join(names) + ")"
    return None, None


def stage_figures(stage_results: list[dict]) -> list[dict]:
    """Each stage's own held-out figures: loss for SFT, preference accuracy for DPO/ORPO, reward for GRPO (in
    total and per reward, before and after: a format reward rising while an accuracy reward falls shows)."""
    keys = (
        "eval_loss",
        "perplexity",
        "preference_loss",
        "pref_accuracy",
        "reward_margin",
        "reward_before",
        "reward_after",
    )
    figures = []
    for s in stage_results:
        result = s["result"]
        row = {
            "stage": s["name"],
            "method": s.get("method"),
            **{k: result[k] for k in keys if result.get(k) is not None},
        }
        for when in ("before", "after"):
            row.update(
                {f"reward_{when}/{name}": value for name, value in (result.get(f"per_reward_{when}") or {}).items()}
            )
        figures.append(row)
    return figures


def pairwise(job: ReportJob, rows: list[dict], results: dict, hardware: Hardware, reporter: Reporter) -> dict:
    """The merged model judged against the base and against the first stage, each prompt in both orders."""
    from ..infer.backends import LocalBackend, as_backend
    from .judge import Judge
    from .replies import generate

    backend = (
        as_backend(job.settings.judge)
        if job.settings.judge
        else LocalBackend(job.base_model, device=hardware.device, dtype=hardware.dtype)
    )
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


def stage_nll(job: ReportJob, rows: list[dict], results: dict, hardware: Hardware, reporter: Reporter) -> list[dict]:
    """Held-out NLL of base, of each stage's model (the chain up to it, folded in) and so of merged, all on the
    same rows: the one figure every stage compares on, whatever its own objective (a DPO loss is not an NLL)."""
    adapters = [str(Path(s["dir"]) / "adapter") for s in job.stages]
    out = [{"model": "base", "eval_loss": results["base"]["eval_loss"], "perplexity": results["base"]["perplexity"]}]
    for i, stage in enumerate(job.stages):
        if i == len(job.stages) - 1:
            figures = results["merged"]  # the whole chain is the merged model
        else:
            reporter.log(f"held-out loss of the model after {stage['name']} on the same {len(rows)} rows")
            model = load_model(job.base_model, hardware, adapters=adapters[: i + 1])
            figures = completion_loss(model, load_tokenizer(job.base_model), rows, max_len=job.max_len)
            del model
        out.append(
            {
                "model": f"after {stage['name']}",
                "stage": stage["name"],
                "eval_loss": figures["eval_loss"],
                "perplexity": figures["perplexity"],
            }
        )
    return out


def _plot(curves: list[tuple[str, str, list[dict]]], out: Path) -> Path | None:
    return progress.plot_stages(curves, out)  # one panel per stage: each objective on its own axis


def _fmt(value) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def markdown(report: dict) -> str:
    base, merged = report["base"], report["merged"]
    if report.get("task") == "prompts":
        lines = _prompts_markdown(report)
    else:
        names = ["eval_loss", "perplexity"] + list(base.get("metrics", {}))
        lines = [
            "# Evaluation report",
            "",
            f"{report['rows']} {'held-out' if report['held_out'] else 'training'} rows, base model against "
            "merged model.",
            "",
            "| metric | base | merged |",
            "|---|---|---|",
        ]
        for name in names:
            b = base.get(name, base.get("metrics", {}).get(name))
            m = merged.get(name, merged.get("metrics", {}).get(name))
            lines.append(f"| {name} | {_fmt(b)} | {_fmt(m)} |")
        verdict = "not worse than" if report["merged_not_worse"] else "WORSE than"
        lines += [
            "",
            f"Task metrics ({', '.join(report.get('metrics') or []) or 'none'}; chosen by the "
            f"{report.get('metrics_chosen_by', 'references')}) computed on "
            f"{report.get('computed_on', {}).get('metrics', 'the same rows')}.",
            "",
            f"The merged model is **{verdict}** the base model on held-out loss.",
            "",
        ]
    if report.get("stage_nll"):
        lines += [
            "## Held-out loss after each stage (the same rows, reply tokens only)",
            "",
            "Like with like: every stage's model on the same held-out rows, whatever objective it trained on.",
            "",
            "| model | eval_loss | perplexity |",
            "|---|---|---|",
        ]
        lines += [f"| {s['model']} | {_fmt(s['eval_loss'])} | {_fmt(s['perplexity'])} |" for s in report["stage_nll"]]
        lines.append("")
    if report.get("stages"):
        columns = sorted({k for s in report["stages"] for k in s} - {"stage", "method"})
        lines += [
            "## Each stage's own figures",
            "",
            "Each on its own terms: eval_loss is an SFT stage's reply NLL on its held-out rows, preference_loss "
            "a DPO/ORPO stage's objective on its held-out pairs, reward_* a GRPO stage's rewards on its "
            "held-out prompts; compare stages with the table above.",
            "",
            "| stage | method | " + " | ".join(columns) + " |",
            "|---|---|" + "---|" * len(columns),
        ]
        lines += [
            f"| {s['stage']} | {s.get('method')} | " + " | ".join(_fmt(s.get(c, "")) for c in columns) + " |"
            for s in report["stages"]
        ]
        lines.append("")
    if "feedback" in report:
        lines += _feedback_markdown(report)
    if report.get("judge"):
        lines += [
            "## Pairwise judge (merged model as A, each prompt judged in both orders)",
            "",
            f"Judge: {report['judge']['judge']}",
            "",
            "| against | wins | ties | losses | unparsed | disagreements | win rate |",
            "|---|---|---|---|---|---|---|",
        ]
        for name in ("vs_base", "vs_first_stage"):
            if name in report["judge"]:
                j = report["judge"][name]
                lines.append(
                    f"| {name[3:]} | {j['wins']} | {j['ties']} | {j['losses']} | {j['unparsed']} | "
                    f"{j['disagreements']} | {_fmt(j['win_rate'])} |"
                )
        lines.append("")
    lines += ["## Samples", ""]
    for i, s in enumerate(report["samples"], 1):
        lines += [
            f"### {i}. {' '.join(s['prompt'].split())[:80]}",
            "",
            "| reference | base | merged |",
            "|---|---|---|",
            "| " + " | ".join(_cell(s[k]) for k in ("reference", "base", "merged")) + " |",
            "",
        ]
        if "base_reward" in s:
            lines += [f"Weighted reward: base {_fmt(s['base_reward'])}, merged {_fmt(s['merged_reward'])}.", ""]
    return "\n".join(lines)


def _feedback_markdown(report: dict) -> list[str]:
    """What the retraining trained on, objective by objective, and its figures on the held-out feedback."""
    lines = [
        "## Retraining from feedback",
        "",
        "| objective | ran | trained on | records | why not |",
        "|---|---|---|---|---|",
    ]
    for o in report.get("objectives", []):
        lines.append(
            f"| {o['objective']} | {'yes' if o['ran'] else 'no'} | {o.get('rows', 0)} {o.get('unit', 'rows')} "
            f"| {o.get('records', 0)} | {o.get('skipped') or ''} |"
        )
    held = report["feedback"]["held_out"]
    lines += [
        "",
        f"Held-out feedback (conversations never trained on): {held['rated_replies']} rated replies "
        f"({held['liked']} liked or edited, {held['disliked']} disliked), {held['pairs']} pairs, "
        f"{held['prompts']} prompts; starting model against the retrained one.",
        "",
        "| figure | start | retrained | gain |",
        "|---|---|---|---|",
    ]
    for name in ("reward", "pair_accuracy", "liked_share"):
        figures = report["feedback"].get(name)
        if figures:
            lines.append(
                f"| {name} | {_fmt(figures['start'])} | {_fmt(figures['retrained'])} | {_fmt(figures['gain'])} |"
            )
        else:
            lines.append(f"| {name} | not measured | | |")
    lines += [
        "",
        "reward: mean change of the per-token log-probability of held-out replies, + for liked and - for "
        "disliked ones (above 0: towards what people liked). pair_accuracy: share of held-out pairs whose "
        "chosen reply is the likelier. liked_share: share of fresh replies the gate's taste likes.",
        "",
    ]
    return lines


def _prompts_markdown(report: dict) -> list[str]:
    """The head of a prompt task's report: what each figure is computed on, rewards, share scoring 1, metrics."""
    base, merged, on = report["base"], report["merged"], report["computed_on"]
    split = "held-out" if report["held_out"] else "training"
    lines = [
        "# Evaluation report",
        "",
        f"{report['rows']} {split} prompts, base model against merged model, each answering greedily.",
        "",
        f"- Rewards: {on['rewards']}.",
        f"- Task metrics: {on['metrics']}.",
        f"- Loss and perplexity: {on['loss']}.",
        f"- Samples: {on['samples']}.",
        "",
    ]
    if report.get("rewards"):
        lines += [
            "## Rewards",
            "",
            f"Mean reward on the {report['rows']} {split} prompts.",
            "",
            "| reward | type | weight | base | merged |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['name']} | {r['type']} | {_fmt(r['weight'])} | {_fmt(base['rewards'].get(r['name']))} | "
            f"{_fmt(merged['rewards'].get(r['name']))} |"
            for r in report["rewards"]
        ]
        lines += [f"| **weighted total** | | | {_fmt(base['reward'])} | {_fmt(merged['reward'])} |", ""]
        if base.get("accuracy"):
            lines += [
                f"Accuracy-like rewards, share scoring 1 on the {report['rows']} {split} prompts:",
                "",
                "| reward | base | merged |",
                "|---|---|---|",
            ]
            lines += [
                f"| {name} | {_fmt(value)} | {_fmt(merged['accuracy'].get(name))} |"
                for name, value in base["accuracy"].items()
            ]
            lines.append("")
        errors = {n: c for n, c in (merged.get("reward_errors") or {}).items() if c}
        if errors:
            lines += ["Rows a reward failed on (scored 0): " + ", ".join(f"{n} {c}" for n, c in errors.items()), ""]
    if base.get("metrics"):
        lines += [
            "## Task metrics",
            "",
            f"Against the reference answers of the {report['rows']} {split} prompts.",
            "",
            "| metric | base | merged |",
            "|---|---|---|",
        ]
        lines += [
            f"| {name} | {_fmt(value)} | {_fmt(merged['metrics'].get(name))} |"
            for name, value in base["metrics"].items()
        ]
        lines.append("")
    if report["merged_not_worse"] is None:
        lines += ["Nothing to compare the models on: no GRPO rewards and no reference answers.", ""]
    else:
        verdict = "not worse than" if report["merged_not_worse"] else "WORSE than"
        lines += [f"The merged model is **{verdict}** the base model on the {report['not_worse_on']}.", ""]
    return lines


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", "<br>")[:600]
