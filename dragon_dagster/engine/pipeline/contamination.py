"""Which of a pipeline's datasets are trained on and which are measured on, and the contamination check's verdict
on them: an evaluation row that a training split holds (engine/evaluate/contamination.py). For a report, the
evaluation sets are the held-out split of every dataset a training stage of its model reads (their held-out
figures: a GRPO stage's held-out prompts, a DPO stage's held-out pairs) or the report measures, and the bundled
general-skills items the report runs; the training sets are the train split of every dataset a training stage of
its model reads (the stages its merged model is made of). A dataset's held-out split is not checked against its own
train split: that is its held_out_not_leaking check's business."""

from __future__ import annotations

from pathlib import Path

from ..config.checks import CheckOutcome
from ..evaluate.contamination import Contamination, find_contamination, read_rows, skill_items
from ..stages.evaluate.settings import Evaluate
from .definition import Pipeline

SHOWN = 5  # contaminated rows named in the check's description (the metadata lists more)


def upstream_of(pipeline: Pipeline, name: str) -> set[str]:
    """Every stage the named one reads, directly or through others."""
    found, todo = set(), [name]
    while todo:
        for upstream in pipeline.upstream(todo.pop()):
            if upstream not in found and pipeline.stage_or_none(upstream) is not None:
                found.add(upstream)
                todo.append(upstream)
    return found


def training_datasets(pipeline: Pipeline, report: Evaluate) -> list[str]:
    """The dataset stages that the training stages of the report's model (those its merged model is made of,
    directly or through the chain) train on, in pipeline order. A stage trained beside that model is not its
    business: its blocked dataset must not stop this report."""
    made_of = upstream_of(pipeline, pipeline.upstream(report.name)[0])
    names = {
        getattr(s, "dataset", None) for s in pipeline.stages if s.name in made_of and pipeline.role_of(s) == "training"
    }
    return [s.name for s in pipeline.stages if s.name in names]


def evaluation_datasets(pipeline: Pipeline, report: Evaluate) -> list[str]:
    """The dataset stages whose held-out split the report's model is scored on: its training stages' (their
    held-out figures are in the report) and the report's own."""
    names = set(training_datasets(pipeline, report)) | {report.dataset}
    return [s.name for s in pipeline.stages if s.name in names]


def fix(report: Evaluate) -> str:
    return (
        "Remove those rows from the evaluation set or from the training set (a dataset stage's group_by keeps "
        "related rows on one side; two stages drawing from one source must not split it differently), or set "
        f"allow_contamination: true on {report.name} to make this a warning."
    )


def judge_contamination(pipeline: Pipeline, report: Evaluate, artifacts: dict[str, Path | None]) -> CheckOutcome:
    """The check's verdict from the dataset artifacts by stage name (None: not materialized yet, so unchecked)."""
    training = {
        name: read_rows(artifacts[name] / "train.jsonl")
        for name in training_datasets(pipeline, report)
        if artifacts.get(name)
    }
    evaluation = {
        name: list(read_rows(artifacts[name] / "eval.jsonl"))
        for name in evaluation_datasets(pipeline, report)
        if artifacts.get(name)
    }
    skills, unreadable = skill_items(report.skills)
    evaluation.update(skills)
    exempt = {name: {name} for name in evaluation}  # a split against its own train: the leak check's
    found = find_contamination(training, evaluation, report.contamination_ngram, exempt, report.contamination_share)
    missing = sorted(name for name, path in artifacts.items() if path is None)
    metadata = found.metadata() | {
        "allow_contamination": report.allow_contamination,
        "not_materialized": ", ".join(missing) or "none",
        "skills_not_checked": ", ".join(unreadable) or "none",
    }
    return CheckOutcome(
        passed=not found.matches,
        metadata=metadata,
        description=problem(found, report) if found.matches else None,
        severity="warn" if report.allow_contamination else "error",
    )


def problem(found: Contamination, report: Evaluate) -> str:
    sets = ", ".join(
        f"{found.contaminated[name]} of {found.checked[name]} rows of {name}" for name in found.contaminated
    )
    shown = "; ".join(m.line() for m in found.matches[:SHOWN])
    more = f" (and {len(found.matches) - SHOWN} more in the metadata)" if len(found.matches) > SHOWN else ""
    return (
        f"{len(found.matches)} evaluation rows are {found.dirty_share:.0%} or more made of runs of {found.n} words "
        f"that training rows hold ({sets}): their figures would measure recall. {shown}{more}. {fix(report)}"
    )
