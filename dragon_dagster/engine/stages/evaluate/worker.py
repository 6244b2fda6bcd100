"""The evaluate kind's worker: base model against the merged model on the same held-out rows (loss, task metrics,
rewards, the held-out loss after each stage, a pairwise judge), and a retraining's figures on held-out feedback."""

from __future__ import annotations

import json
import math
from pathlib import Path

from ...artifacts import progress
from ...config.job import Job
from ...config.reporter import Reporter
from ...config.results import HeldOutRows
from ...data.tables import read_jsonl
from ...evaluate.feedback_gain import gain, held_out_feedback, model_figures
from ...evaluate.pass_at_k import compare, right_counts
from ...evaluate.per_row import REPLIES_FILE, per_row, write_replies
from ...evaluate.plots import plot_stages
from ...evaluate.replies import evaluate_rows, has_replies, score_prompt_rows
from ...evaluate.stage_change import stage_changes
from ...evaluate.tool_use import mcnemar, measure, tool_cases
from ...infer.logprobs import completion_loss
from ...models import chain_tokenizer, load_model
from ...rewards import ACCURACY_TYPES, Reward, RewardSet, parse_reward
from ...tools import template
from ...tools.declare import Toolset, with_tools
from ...tools.template import uses_tools
from ...train.held_out import sample_rows
from . import skills
from .inputs import ChainStage, ReportInputs
from .markdown import markdown
from .result import ReportResult
from .settings import Evaluate

ReportJob = Job[Evaluate, ReportInputs]


def report_rows(job: ReportJob) -> tuple[list[dict], bool, HeldOutRows]:
    """The rows the report scores: a sample of max_eval_rows drawn with the stage's seed from the held-out split
    (from the training rows when the dataset holds none out), whether they are held out, and how many of how
    many were scored. Every figure of the report (losses, replies, replies.jsonl, each stage's change, the judge's
    prompts) is on these rows, so its cost stays bounded however large the split."""
    inputs, settings = job.inputs, job.settings
    rows = read_jsonl(inputs.eval_file) if Path(inputs.eval_file).exists() else []
    held_out = bool(rows)
    if not rows and inputs.train_file:
        rows = read_jsonl(inputs.train_file)
    if not rows:
        raise ValueError(f"no rows to evaluate on in {inputs.eval_file}")
    total = len(rows)
    rows = sample_rows(rows, settings.max_eval_rows, settings.seed)
    return rows, held_out, HeldOutRows(scored=len(rows), total=total, setting="max_eval_rows")


def evaluate_report(job: ReportJob, reporter: Reporter) -> ReportResult:
    hardware, inputs = job.hardware, job.inputs
    rows, held_out, counted = report_rows(job)
    prompts_only = not has_replies(rows)  # a prompt dataset: no reference replies, so no loss
    toolset = Toolset.from_input(inputs.tools)
    if toolset is not None and not prompts_only:
        with_tools(rows, toolset.schemas)  # rendered as training rendered them
    cases = tool_cases(rows) if toolset is not None and not prompts_only else []
    tool_raw = {}
    rewards, reward_specs = reward_set(inputs.chain) if prompts_only else (None, [])
    if rewards is not None:
        rewards.bind_tools(toolset.schemas if toolset else None)
    split = "held-out" if held_out else "training"
    results, feedback_raw, skill_scores, right = {}, {}, {}, {}
    temperature = pass_temperature(job)
    rated, pairs, taste, feedback_totals = held_out_feedback_of(job)
    tools_needed = toolset is not None or uses_tools(rows)
    for name, path in (("base", inputs.base_model), ("merged", inputs.merged_model)):
        reporter.log(
            f"evaluating the {name} model on {counted.sentence()} {split} {'prompts' if prompts_only else 'rows'}"
        )
        model, tokenizer = chain_model(path, [], hardware, tools_needed)
        if prompts_only:
            results[name] = score_prompt_rows(
                model,
                tokenizer,
                rows,
                rewards,
                max_new_tokens=job.settings.max_new_tokens,
                metric_names=job.settings.metrics,
            )
            if job.settings.pass_samples and toolset is None:  # with tools a sample is a conversation: not here
                reporter.log(
                    f"pass@k: {job.settings.pass_samples} samples of each of {len(rows)} prompts at temperature "
                    f"{temperature:g}"
                )
                right[name] = right_counts(
                    model,
                    tokenizer,
                    rows,
                    rewards,
                    job.settings.pass_samples,
                    temperature,
                    job.settings.max_new_tokens,
                    seed=0,
                )
        else:
            results[name] = evaluate_rows(
                model,
                tokenizer,
                rows,
                n_samples=None,
                max_new_tokens=job.settings.max_new_tokens,
                max_len=inputs.max_len,
                metric_names=job.settings.metrics,
            )
        if cases:
            reporter.log(f"the {name} model's tool use on {len(cases)} {split} conversations that call a tool")
            tool_raw[name] = measure(model, tokenizer, cases, toolset, job.settings.max_new_tokens)
            results[name]["tools"] = tool_raw[name]["figures"]
        if inputs.feedback:
            reporter.log(
                f"the {name} model on the held-out feedback: {len(rated)} of {feedback_totals['rated_replies']} "
                f"rated replies, {len(pairs)} of {feedback_totals['pairs']} pairs (at most max_eval_rows of each)"
            )
            feedback_raw[name] = model_figures(
                model,
                tokenizer,
                rated,
                pairs,
                taste,
                max_len=inputs.max_len,
                max_new_tokens=job.settings.max_new_tokens,
            )
        skill_scores[name] = skills.measure(job.settings, name, model, tokenizer, reporter)
        del model
    out = Path(job.output_dir)
    judged_rows: dict = {}  # the judge's verdict on each row it saw, for replies.jsonl
    judged = pairwise(job, rows, results, hardware, reporter, judged_rows) if job.settings.n_judge > 0 else {}
    write_replies(out / REPLIES_FILE, per_row(results, list(results["base"]["metrics"]), judged_rows))
    curves = [(s.name, s.loss_label, progress.read(s.dir)) for s in inputs.chain]
    plot = plot_stages(curves, out / "loss.png")  # one panel per stage: each objective on its own axis
    n_samples = min(job.settings.n_samples, len(rows))
    samples = [
        {"prompt": b["prompt"], "reference": b["reference"], "base": b["generated"], "merged": m["generated"]}
        for b, m in zip(results["base"]["samples"][:n_samples], results["merged"]["samples"][:n_samples])
    ]
    report = {
        "task": "prompts" if prompts_only else "chat",
        "held_out": held_out,
        "rows": len(rows),
        "held_out_rows": counted.model_dump(),
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
        models = stage_nll(job, rows, results, hardware, reporter, tools_needed) if len(inputs.chain) > 1 else []
        report["stage_changes"] = stage_changes(models)  # per-row pairs, then only the figures are kept
        report["stage_nll"] = [{k: v for k, v in m.items() if k != "row_nll"} for m in models]
        report["computed_on"] = {
            "rows": len(rows),
            "split": split,
            "loss": f"the reference replies of {len(rows)} {split} rows (reply tokens only)",
            "metrics": f"all {len(rows)} {split} rows: greedy replies against their reference replies (an "
            "adapter's metrics.json is on its first n_samples rows only)",
            "samples": f"the first {n_samples} of those rows",
        }
    # each sampling stage's pass@k against its start, then merged against base on this report's prompts
    changes = [change for stage in inputs.chain for change in stage.pass_at_k]
    if right.get("merged"):
        changes += compare(
            right["base"],
            right["merged"],
            job.settings.pass_samples,
            job.settings.pass_k,
            temperature,
            "merged",
            "base",
        )
    report["pass_at_k"] = [change.model_dump() for change in changes]
    if cases:
        report["tool_use"] = {
            "tools": toolset.names,
            "paired": mcnemar(tool_raw["base"]["call_correct"], tool_raw["merged"]["call_correct"]),
            "samples": [
                {"question": c["prompt"][-1]["content"], "expected": c["call"].name, "base": b, "merged": m}
                for c, b, m in zip(cases, tool_raw["base"]["samples"], tool_raw["merged"]["samples"])
            ][:n_samples],
        }
    if inputs.feedback:
        report["feedback"] = gain(feedback_raw["base"], feedback_raw["merged"], rated, pairs, inputs.feedback.liked_at)
        if feedback_totals != {"rated_replies": len(rated), "pairs": len(pairs)}:  # sampled: out of how many
            report["feedback"]["held_out"]["sampled_from"] = feedback_totals
        report["objectives"] = inputs.feedback.objectives
        if "taste_samples" in feedback_raw["base"]:
            report["feedback"]["taste_samples"] = [
                {"prompt": b["prompt"], "start": b["reply"], "retrained": m["reply"]}
                for b, m in zip(feedback_raw["base"]["taste_samples"], feedback_raw["merged"]["taste_samples"])
            ][:n_samples]
    if job.settings.skills:
        report["skills"] = skills.section(job.settings, skill_scores["base"], skill_scores["merged"])
    report.update(
        {
            "base": {k: v for k, v in results["base"].items() if k not in ("samples", "row_nll")},
            "merged": {k: v for k, v in results["merged"].items() if k not in ("samples", "row_nll")},
            "merged_not_worse": not_worse,
            "stages": [{"stage": s.name, "method": s.objective, **s.figures} for s in inputs.chain],
            "judge": judged,
            "samples": samples,
            "loss_plot": plot.relative_to(out).as_posix() if plot else None,  # relative: the staging dir is renamed
        }
    )
    (out / "report.json").write_text(json.dumps(report, indent=2, ensure_ascii=False))
    (out / "report.md").write_text(markdown(report))
    return ReportResult.model_validate(report)


def pass_temperature(job: ReportJob) -> float:
    """The temperature pass@k samples at: the stage's setting, else the chain's last sampling stage's, else 1.0."""
    if job.settings.pass_temperature is not None:
        return job.settings.pass_temperature
    sampled = [s.temperature for s in job.inputs.chain if s.temperature is not None]
    return sampled[-1] if sampled else 1.0


def held_out_feedback_of(job: ReportJob):
    """(rated replies, pairs, taste RewardSet or None, how many of each the held-out feedback has) a retraining's
    report measures; empty otherwise. Replies and pairs each a sample of at most max_eval_rows drawn with the
    stage's seed (the report's feedback.held_out.sampled_from says out of how many)."""
    feedback = job.inputs.feedback
    if feedback is None:
        return [], [], None, {}
    rated, pairs = held_out_feedback(feedback.held_out)  # the asset copied them into the report's directory
    totals = {"rated_replies": len(rated), "pairs": len(pairs)}
    # bounded as the held-out rows are: each costs a loss pass per model (and a fresh reply with a taste)
    rated = sample_rows(rated, job.settings.max_eval_rows, job.settings.seed)
    pairs = sample_rows(pairs, job.settings.max_eval_rows, job.settings.seed)
    # the taste's custom files were copied there too, their paths written relative to it
    taste = RewardSet(feedback.taste, base_dir=job.output_dir) if feedback.taste else None
    if taste is not None and feedback.reward_models:  # a learned taste: the reward model scores the fresh replies
        from ...infer.reward_model import load_scorer

        taste.bind_scorers(
            {m.stage: load_scorer(m.model, m.adapter, job.hardware).score for m in feedback.reward_models}
        )
    return rated, pairs, taste, totals


def reward_set(stages: list[ChainStage]) -> tuple[RewardSet | None, list[dict]]:
    """The rewards the stages of the merged model's chain were trained against, from their results: a custom
    reward's file is relative to its stage's artifact dir (it was copied into rewards/ there). A later stage's
    reward of the same name replaces an earlier one's. (None, []) when no stage trained against rewards."""
    rewards: dict[str, Reward] = {}
    specs: dict[str, dict] = {}
    for stage in stages:
        for spec in stage.rewards:
            reward = parse_reward(spec, base_dir=stage.dir)
            rewards[reward.name] = reward
            specs[reward.name] = {
                "name": reward.name,
                "type": reward.type,
                "weight": reward.weight,
                "stage": stage.name,
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
        "rewards": f"{replies}, scored with the rewards of {', '.join(stages)}; accuracy: the share of those "
        "prompts scoring 1 on an accuracy-like reward"
        if reward_specs
        else "absent: no stage of the merged model's chain trained against rewards",
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


def pairwise(
    job: ReportJob, rows: list[dict], results: dict, hardware, reporter: Reporter, rows_out: dict | None = None
) -> dict:
    """The merged model judged against the base and against the first stage, each prompt in both orders.
    rows_out: filled with each comparison's per-row verdicts ({"vs_base": [PairwiseRow, ...]})."""
    from ...evaluate.judge import Judge
    from ...infer.backend_registry import as_backend
    from ...infer.generation import generate
    from ...infer.local_backend import LocalBackend

    inputs = job.inputs
    backend = (
        as_backend(job.settings.judge)
        if job.settings.judge
        else LocalBackend(inputs.base_model, device=hardware.device, dtype=hardware.dtype)
    )
    judge = Judge(backend, cache_path=Path(job.output_dir) / "judge_cache.sqlite", max_new_tokens=96)
    sample = rows[: job.settings.n_judge]
    n = len(sample)
    prompts = [r["prompt"] for r in sample]
    references = [s["reference"] for s in results["merged"]["samples"][:n]]
    merged = [s["generated"] for s in results["merged"]["samples"][:n]]
    base = [s["generated"] for s in results["base"]["samples"][:n]]
    reporter.log(f"judging merged against base on {n} prompts (both orders) with {backend!r}")
    vs_base = judge.compare(prompts, merged, base, references)
    out = {"judge": repr(backend), "vs_base": vs_base.summary()}
    if rows_out is not None:
        rows_out["vs_base"] = vs_base.rows
    if inputs.first_stage_adapters:
        model, tokenizer = chain_model(inputs.base_model, inputs.first_stage_adapters, hardware, False)
        first = generate(model, tokenizer, prompts, max_new_tokens=job.settings.max_new_tokens)
        vs_first = judge.compare(prompts, merged, first, references)
        out["vs_first_stage"] = vs_first.summary()
        if rows_out is not None:
            rows_out["vs_first_stage"] = vs_first.rows
    return out


def _not_worse(base: float, merged: float) -> bool:
    return math.isfinite(merged) and (not math.isfinite(base) or merged <= base + 1e-6)


def chain_model(path: str, adapters: list[str], hardware, tools_needed: bool):
    """(model, tokenizer) of one model of the report's chain, scored as it was trained: base (no adapters), the
    model after a stage (the chain up to it folded in) or merged (a directory). Every one of them is loaded here, so
    all render the rows alike: the tokenizer saved with the last adapter, whose template training readied (tools,
    generation marks: tools/template.py), else the model's own (a merged model's was saved from its last
    adapter's); with tools or tool turns, a template that renders them, readied as training readies it (a base
    model's own template may render no tools)."""
    tokenizer = chain_tokenizer(path, adapters)
    if tools_needed:
        template.prepare(tokenizer, needed=True)
    return load_model(path, hardware, adapters=adapters), tokenizer


def stage_nll(
    job: ReportJob, rows: list[dict], results: dict, hardware, reporter: Reporter, tools_needed: bool = False
) -> list[dict]:
    """Held-out NLL of base, of each stage's model (the chain up to it, folded in) and so of merged, all on the
    same rows and each through chain_model, as base and merged are: the one figure every stage compares on,
    whatever its own objective (a preference loss is not an NLL)."""
    inputs = job.inputs
    adapters = [str(Path(s.dir) / "adapter") for s in inputs.chain]
    base = results["base"]
    out = [
        {"model": "base", "eval_loss": base["eval_loss"], "perplexity": base["perplexity"], "row_nll": base["row_nll"]}
    ]
    for i, stage in enumerate(inputs.chain):
        if i == len(inputs.chain) - 1:
            figures = results["merged"]  # the whole chain is the merged model
        else:
            reporter.log(f"held-out loss of the model after {stage.name} on the same {len(rows)} rows")
            model, tokenizer = chain_model(inputs.base_model, adapters[: i + 1], hardware, tools_needed)
            figures = completion_loss(model, tokenizer, rows, max_len=inputs.max_len)
            del model
        out.append(
            {
                "model": f"after {stage.name}",
                "stage": stage.name,
                "eval_loss": figures["eval_loss"],
                "perplexity": figures["perplexity"],
                "row_nll": figures["row_nll"],
            }
        )
    return out
