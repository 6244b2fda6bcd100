"""What the studio's page says of a run it started, from what Dagster recorded, and what its Run button starts.

- Each stage's row is Dagster's step status, except where the run says more: the step a cancelled run stopped
  reads CANCELED (Dagster records it as a failed step of a CANCELED run) with the checkpoint its trainer saved on
  the cancel (engine/train/trainer.py; the store keeps it under checkpoints/<pipeline>/<stage>/<run id> for
  `resume: true`), and a step that reused an earlier artifact reads REUSED with the run that made it (its
  materialization's `reused_from_run`, assets/reuse.py).
- The line a run ends with says what happened (a rerun that trained nothing says so) and links only to pages that
  are served: the run's page where a Dagster webserver runs it, the MLflow runs where an MLflow UI answers.
- Run starts the saved defs.yaml: `unsaved` names what the form has that the saved pipeline does not, and
  `replace_saved` writes the form over it when the person asks to save and run.
"""

from __future__ import annotations

import filecmp
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
import yaml

from ..engine.artifacts.checkpoints import last_checkpoint
from ..engine.pipeline.draft import Draft, write
from .launch import Launched, StepState

STOPPED = ("FAILURE", "RUNNING")  # a cancelled run's step that was running: failed by the interrupt, or ending


@dataclass(frozen=True)
class StageRow:
    """One stage as the page's table shows it."""

    stage: str  # pipeline/stage
    status: str  # Dagster's step status, or CANCELED / CANCELING / REUSED where the run says more
    seconds: float
    note: str = ""  # the checkpoint kept, the run a reused artifact came from, the stage a check is of
    made_by: str | None = None  # a reused stage's: the Dagster run that made its artifact
    check: bool = False  # an asset check's step (run again on a reused artifact too), not a stage


def stage_rows(
    state: str, steps: list[StepState], checkpoint: Callable[[str], Path | None], assets: list[str]
) -> list[StageRow]:
    """The table's rows for a run in Dagster state `state`; checkpoint(stage): the checkpoint its run kept;
    assets: the pipeline's own (pipeline/name), whose steps are stages; the other steps are their checks."""
    rows = []
    for step in steps:
        if step.stage not in assets:
            checked = [a for a in assets if step.stage.startswith(f"{a}_")]
            of = f"a check of {max(checked, key=len).split('/')[-1]}" if checked else "a check"
            rows.append(StageRow(step.stage, step.status, step.seconds, of, check=True))
        elif step.reused_from:
            rows.append(
                StageRow(step.stage, "REUSED", step.seconds, f"made by run {step.reused_from}", step.reused_from)
            )
        elif state in ("CANCELING", "CANCELED") and step.status in STOPPED:
            kept = checkpoint(step.stage) if state == "CANCELED" else None
            note = f"checkpoint kept: {kept}" if kept else ""
            rows.append(StageRow(step.stage, state, step.seconds, note))
        else:
            rows.append(StageRow(step.stage, step.status, step.seconds))
    return rows


def kept_checkpoint(checkpoints_root: Callable[[str, str], Path], run_id: str, stage: str) -> Path | None:
    """The newest complete checkpoint the run left for stage (pipeline/stage); checkpoints_root: the store's."""
    pipeline, name = stage.split("/", 1)
    return last_checkpoint(checkpoints_root(pipeline, name) / run_id)


# ------------------------------------------------------------------------------------------------------ links


def mlflow_ui_answers(ui: str) -> bool:
    """Whether an MLflow UI answers at ui (its /health)."""
    try:
        found = requests.get(f"{ui}/health", timeout=2)
        return found.ok and found.text.strip() == "OK"
    except requests.RequestException:
        return False


@dataclass(frozen=True)
class Links:
    """Where the run can be looked at: a page only where one is served."""

    dagster: str | None  # the run's page, where a Dagster webserver runs it
    mlflow: str | None  # the pipeline's MLflow runs, where an MLflow UI answers
    mlflow_ui: str  # where the MLflow UI is looked for

    def markdown(self) -> str:
        dagster = (
            f"[the run in Dagster]({self.dagster})"
            if self.dagster
            else "in this project's Dagster instance, which `dg dev` serves"
        )
        mlflow = (
            f"[its MLflow runs]({self.mlflow})"
            if self.mlflow
            else f"no MLflow UI answers at `{self.mlflow_ui}` to show its MLflow runs (`make ui` starts one)"
        )
        return f"{dagster}; {mlflow}"


def links(launched: Launched, pipeline: str, tracking) -> Links:
    dagster = f"{launched.dagster_url}/runs/{launched.run_id}" if launched.dagster_url and launched.run_id else None
    mlflow = tracking.runs_url(pipeline) if mlflow_ui_answers(tracking.ui) else None
    return Links(dagster, mlflow, tracking.ui)


# -------------------------------------------------------------------------------------------------- its end


def ended_line(name: str, state: str, launched: Launched, rows: list[StageRow], where: Links) -> str:
    """What the page says once the run is over."""
    run = f"Dagster run `{launched.run_id}` ({where.markdown()})" if launched.run_id else "no Dagster run was made"
    stages = [r for r in rows if not r.check]
    reused = [r for r in stages if r.status == "REUSED"]
    if state == "SUCCESS":
        chat = f"Talk to the result: *Chat* below, or `dragon chat-ui {name}` (`dragon chat {name}` in a terminal)."
        if stages and len(reused) == len(stages):
            made_by = ", ".join(f"`{r}`" for r in dict.fromkeys(r.made_by for r in reused))
            return (
                f"**SUCCESS, nothing trained**: every stage reused what run {made_by} made with the same settings "
                f"and data (tag the run `dragon/fresh=true` to make it anew). {run}. {chat}"
            )
        also = ""
        if reused:
            names = ", ".join(f"{r.stage.split('/')[-1]} (run `{r.made_by}`)" for r in reused)
            also = f" {len(reused)} of {len(stages)} stages reused earlier artifacts: {names}; the rest were made anew."
        return f"**SUCCESS**: {run}.{also} {chat}"
    log = f"; its output: `{launched.log}`" if launched.log else ""
    if state == "CANCELED":
        stopped = [r for r in rows if r.status == "CANCELED"]
        at = f" at {', '.join(r.stage for r in stopped)}" if stopped else ""
        kept = [r.note for r in stopped if r.note]
        saved = (
            f": {'; '.join(kept)} (materialize again with `resume: true` to continue from it)"
            if kept
            else ": no checkpoint had been saved yet"
            if stopped
            else ""
        )
        return f"**CANCELED**{at}{saved}. {run}{log}."
    failed = [r.stage for r in rows if r.status not in ("SUCCESS", "REUSED", "NOT RUN", "SKIPPED")]
    at = f" at {', '.join(failed)}" if failed else ""
    return f"**{state}**{at}: {run}{log}."


# ---------------------------------------------------------------------------------------------- before Run


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    """A pipeline's attributes as dotted keys; a list of named items (stages) by their names."""
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list) and value and all(isinstance(v, dict) and "name" in v for v in value):
        items = ((v["name"], v) for v in value)
    else:
        return {prefix: value}
    flat: dict[str, Any] = {}
    for key, inner in items:
        flat.update(_flat(inner, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def unsaved(made: Draft, saved: Path) -> list[str]:
    """What the form has that the saved defs.yaml (and the data file beside it) does not: the settings that differ,
    as dotted keys, and the data file; [] when Run would start exactly what the form shows."""
    attributes = (yaml.safe_load(saved.read_text()) or {}).get("attributes") or {}
    now, then = _flat(made.attributes), _flat(attributes)
    changed = [key for key in dict.fromkeys([*now, *then]) if now.get(key) != then.get(key)]
    data = saved.parent / made.data_file.name
    if not data.is_file() or not filecmp.cmp(made.data_file, data, shallow=False):
        changed.append(f"the data file ({made.data_file.name})")
    return changed


def replace_saved(made: Draft, defs_dir: Path) -> Path:
    """The form written over the saved pipeline of its name (draft.write never overwrites one): the saved folder
    is set aside until the new one is written, and put back if it cannot be. Returns the defs.yaml's path."""
    target = Path(defs_dir) / made.name
    aside = Path(tempfile.mkdtemp(prefix=f".{made.name}-replaced-", dir=defs_dir))
    try:
        if target.exists():
            os.rename(target, aside / made.name)
        try:
            return write(made, defs_dir)
        except BaseException:
            if (aside / made.name).exists():
                os.rename(aside / made.name, target)
            raise
    finally:
        shutil.rmtree(aside, ignore_errors=True)
