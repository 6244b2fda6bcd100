"""The report's general skills: the evaluate kind's `skills` tasks (evaluate/general_skills.py) on base and
merged, task by task, as report.json's `skills` and report.md's table."""

from __future__ import annotations

from typing import Any

from ...config.reporter import Reporter
from ...evaluate.general_skills import run_skills, skill_changes
from .settings import Evaluate


def measure(settings: Evaluate, name: str, model, tokenizer, reporter: Reporter) -> dict[str, dict]:
    """One model's figures on the settings' skills tasks ({} when none are asked for)."""
    if not settings.skills:
        return {}
    limit = f"at most {settings.skills_limit} items each" if settings.skills_limit else "all items"
    reporter.log(f"general skills of the {name} model: {', '.join(settings.skills)} ({limit})")
    return run_skills(model, tokenizer, settings.skills, limit=settings.skills_limit)


def section(settings: Evaluate, base: dict[str, dict], merged: dict[str, dict]) -> dict[str, Any] | None:
    """report.json's `skills`: which tasks, how many items, and each task's score base against merged."""
    if not settings.skills:
        return None
    return {
        "tasks": list(settings.skills),
        "limit": settings.skills_limit,
        "items": {name: figures["items"] for name, figures in merged.items()},
        "base": base,
        "merged": merged,
        "changes": skill_changes(base, merged),
    }


def markdown(report: dict) -> list[str]:
    skills = report.get("skills")
    if not skills:
        return []
    lines = [
        "## General skills (lm-evaluation-harness)",
        "",
        "Tasks apart from the pipeline's data, the same items for both models"
        + (f" (at most {skills['limit']} per task)" if skills.get("limit") else "")
        + ": what the training cost elsewhere.",
        "",
        "| task | metric | items | base | merged | change |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {c['task']} | {c['metric']} | {skills['items'].get(c['task'], '')} | {c['base']:.4f} | "
        f"{c['merged']:.4f} | {c['change']:+.4f} |"
        for c in skills["changes"]
    ]
    lines.append("")
    return lines


def run_metrics(skills: dict | None, which: str) -> dict[str, float]:
    """skills/<task> of one model (base or merged), for its MLflow run."""
    return {f"skills/{name}": figures["score"] for name, figures in ((skills or {}).get(which) or {}).items()}
