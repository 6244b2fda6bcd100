"""General skills apart from a pipeline's data, through EleutherAI's lm-evaluation-harness: the bundled suite
(skills/: arithmetic, following a format, copying, ordering; local data, no hub) or any lm-eval task name where the
hub is reachable. The evaluate kind's report runs it on base and merged, and a retraining's promotion gate refuses
a model that lost more than its tolerance on a task.

lm-eval is imported only when a suite runs: it is heavy, and most reports do not ask for one."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SKILLS_DIR = Path(__file__).parent / "skills"
SUITE_TAG = "dragon_skills"  # every bundled task carries this tag: the name runs the whole suite

log = logging.getLogger("dragon_dagster")


def local_tasks() -> list[str]:
    """The bundled tasks' names, from their task files."""
    return sorted(p.stem for p in SKILLS_DIR.glob("skills_*.yaml"))


def is_local(name: str) -> bool:
    return name in local_tasks() or name == SUITE_TAG


def task_manager(names: list[str]):
    """lm-eval's TaskManager with the bundled suite on its include path; its own task index (thousands of task
    files, some seconds to read) only when a name is not a bundled one."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(SKILLS_DIR), include_defaults=not all(is_local(n) for n in names))


def run_skills(
    model, tokenizer, tasks: list[str], limit: int | None = None, batch_size: int = 8
) -> dict[str, dict[str, Any]]:
    """Each task's figures on one loaded model: {task: {"metric": the one the gate compares, "score": its value,
    "items": items scored, "metrics": every metric lm-eval reported}}. limit: at most this many items per task."""
    if not tasks:
        return {}
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM

    manager = task_manager(tasks)
    unknown = [n for n in tasks if n not in manager.all_tasks]
    if unknown:
        raise ValueError(
            f"unknown skill task(s) {unknown}: the bundled ones are {', '.join(local_tasks())} (or {SUITE_TAG} for "
            "all of them); any other must be an lm-eval task name, and its data must be reachable"
        )
    with lm_eval_warnings_off():
        lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, device=str(model.device))
        out = simple_evaluate(
            lm,
            tasks=list(tasks),
            task_manager=manager,
            limit=limit,
            bootstrap_iters=0,  # no stderr: the gate compares two scores on the same items
            log_samples=False,
        )
    return {name: _figures(name, out) for name in out["results"] if name not in out.get("group_subtasks", {})}


@contextmanager
def lm_eval_warnings_off() -> Iterator[None]:
    """lm-eval's own warnings, while a suite runs, are addressed to its command line's users: that a loaded model
    was passed (as here, on purpose, in one process) and that a task takes `--metadata`. Its errors still show."""
    lm_eval_log = logging.getLogger("lm_eval")
    level = lm_eval_log.level
    lm_eval_log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        lm_eval_log.setLevel(level)


def _figures(name: str, out: dict) -> dict[str, Any]:
    """A task's lm-eval results as one score: acc when it has one, else its first higher-is-better metric."""
    metrics = {
        key.split(",")[0]: float(value)
        for key, value in out["results"][name].items()
        if "," in key and "_stderr" not in key and isinstance(value, (int, float))
    }
    higher = out.get("higher_is_better", {}).get(name, {})
    candidates = ["acc"] + [m for m, better in higher.items() if better] + list(metrics)
    metric = next(m for m in candidates if m in metrics)
    return {
        "metric": metric,
        "score": metrics[metric],
        "items": int(out.get("n-samples", {}).get(name, {}).get("effective", 0)),
        "metrics": metrics,
    }


def skill_changes(base: dict[str, dict], merged: dict[str, dict]) -> list[dict[str, Any]]:
    """Task by task, base against merged: [{"task", "metric", "base", "merged", "change"}] for the tasks both
    were scored on."""
    return [
        {
            "task": name,
            "metric": figures["metric"],
            "base": figures["score"],
            "merged": merged[name]["score"],
            "change": merged[name]["score"] - figures["score"],
        }
        for name, figures in base.items()
        if name in merged
    ]
