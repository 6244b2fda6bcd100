"""The evaluation report as people read it: report.md, made from report.json."""

from __future__ import annotations

from ...config.results import PassAtK
from ...evaluate.per_row import mlflow_markdown
from ...evaluate.stage_change import ALPHA, TEST
from .skills import markdown as skills_markdown


def _fmt(value) -> str:
    if value is None:
        return "n/a"  # a figure that does not exist is said so, never printed as None
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def stage_change_markdown(changes: list[dict]) -> list[str]:
    """Did each stage help: its model against the one before it on the same rows, with the paired test."""
    lines = [
        "## Did each stage help? (the same held-out rows, row by row)",
        "",
        f"Each stage's model against the model before it: mean reply NLL per row (lower is better), the {TEST} "
        f'test\'s p-value, and the verdict at p < {ALPHA}. On a few rows, "no measurable change" is not proof '
        "of none.",
        "",
        "| stage | against | rows | NLL before | NLL after | change | p-value | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in changes:
        change = c.get("mean_difference")
        lines.append(
            f"| {c['stage']} | {c['against']} | {c['rows']} | {_fmt(c.get('mean_before'))} | "
            f"{_fmt(c.get('mean_after'))} | {'' if change is None else f'{change:+.4f}'} | {_fmt(c.get('p_value'))} "
            f"| **{c['verdict']}** |"
        )
    return lines + [""]


def _rows(report: dict) -> str:
    """How many rows the report scored: '50 of 10000 (a seeded sample: max_eval_rows)', or just the count."""
    counted = report.get("held_out_rows")
    if not counted or counted["scored"] >= counted["total"]:
        return str(report["rows"])
    return f"{counted['scored']} of {counted['total']} (a seeded sample: {counted.get('setting', 'max_eval_rows')})"


def markdown(report: dict) -> str:
    base, merged = report["base"], report["merged"]
    if report.get("task") == "prompts":
        lines = _prompts_markdown(report)
    else:
        names = ["eval_loss", "perplexity"] + list(base.get("metrics", {}))
        lines = [
            "# Evaluation report",
            "",
            f"{_rows(report)} {'held-out' if report['held_out'] else 'training'} rows, base model against "
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
    if report.get("stage_changes"):
        lines += stage_change_markdown(report["stage_changes"])
    if report.get("pass_at_k"):
        lines += pass_at_k_markdown(report)
    if report.get("stages"):
        columns = sorted({k for s in report["stages"] for k in s} - {"stage", "method"})
        lines += [
            "## Each stage's own figures",
            "",
            "Each on its own terms, on its own held-out rows: eval_loss is a reply NLL, preference_loss a "
            "preference objective, reward_* the rewards a stage was trained against (before and after it); "
            "compare stages with the table above.",
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
    if report.get("tool_use"):
        lines += tool_markdown(report)
    lines += skills_markdown(report)
    if report.get("judge"):
        lines += [
            "## Pairwise judge (merged model as A, each prompt judged in both orders)",
            "",
            f"Judge: {report['judge']['judge']}",
            "",
            "| against | wins | ties | losses | unparsed | disagreements | win rate |",
            "|---|---|---|---|---|---|---|",
        ]
        silent = []
        for name in ("vs_base", "vs_first_stage"):
            if name in report["judge"]:
                j = report["judge"][name]
                verdicts = j["wins"] + j["ties"] + j["losses"]
                silent += [] if verdicts else [name[3:]]
                rate = _fmt(j["win_rate"]) if verdicts and j.get("win_rate") is not None else "no verdicts"
                lines.append(
                    f"| {name[3:]} | {j['wins']} | {j['ties']} | {j['losses']} | {j['unparsed']} | "
                    f"{j['disagreements']} | {rate} |"
                )
        if silent:
            lines += [
                "",
                f"The judge gave no verdict it could read against {' or '.join(silent)}: it cannot judge these "
                "pairs (a small model rarely answers in the verdict's form), so there is no win rate. Set the "
                "stage's `judge:` to a model or a server that can ({url, model}), or `n_judge: 0` to skip judging.",
            ]
        lines.append("")
    if report.get("mlflow_evaluation"):  # added by the Dagster side once MLflow has the evaluation
        lines += mlflow_markdown(report["mlflow_evaluation"])
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
        f"{_rows(report)} {split} prompts, base model against merged model, each answering greedily.",
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


TOOL_FIGURES = ("tool_call_valid", "right_tool", "arguments_match", "call_correct", "answer_exact", "answer_token_f1")


def tool_markdown(report: dict) -> list[str]:
    """The tool-use table, base against merged, and the paired test on call_correct."""
    use, base, merged = report["tool_use"], report["base"].get("tools", {}), report["merged"].get("tools", {})
    paired = use["paired"]
    lines = [
        "## Tool use",
        "",
        f"{base.get('conversations')} held-out conversations that call a tool ({', '.join(use['tools'])}): the "
        "first reply's call against the conversation's, then the whole conversation run with the tools, its "
        "final answer against the reference answer.",
        "",
        "| figure | base | merged |",
        "|---|---|---|",
    ]
    lines += [f"| {name} | {_fmt(base.get(name))} | {_fmt(merged.get(name))} |" for name in TOOL_FIGURES]
    lines += [
        "",
        f"call_correct, paired (McNemar's exact test): {paired['only_merged']} conversations only the merged model "
        f"called right, {paired['only_base']} only the base model; p = {paired['p_value']:.4g}.",
        "",
    ]
    return lines


def pass_at_k_markdown(report: dict) -> list[str]:
    """pass@1 and pass@k, each model against the one it is compared with, and the sign test's verdict."""
    lines = [
        "## pass@1 and pass@k (sampled replies, scored by the accuracy-like rewards)",
        "",
        "Each prompt sampled n times by both models: pass@1 is the share of samples scoring 1, pass@k the chance "
        "that k tries hold one (the unbiased estimator over the n). A stage's row compares its model with the model "
        "it started from, on its own held-out prompts; merged against base is on this report's prompts. The verdict "
        f"is the exact sign test over the prompts whose right count rose or fell, at p < {ALPHA}.",
        "",
        "| model | against | reward | prompts x samples | temperature | pass@1 | pass@k | prompts up / down | p-value "
        "| verdict |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in map(PassAtK.model_validate, report["pass_at_k"]):
        lines.append(
            f"| {c.model} | {c.compared_with()} | {c.reward} | {c.prompts} x {c.samples} | {c.temperature:g} | "
            f"{c.pass1_before:.3f} -> {c.pass1_after:.3f} | pass@{c.k} {c.passk_before:.3f} -> {c.passk_after:.3f} "
            f"| {c.prompts_up} / {c.prompts_down} | {_fmt(c.p_value)} | **{c.verdict}** |"
        )
    return lines + [""]
