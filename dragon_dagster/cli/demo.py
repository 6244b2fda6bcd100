"""`dragon demo` and `dragon status`: a pipeline run end to end with what it made, and what is out of date."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import click
from rich.table import Table

from .common import console, ensure_dagster_home, one_line, pipeline_argument, reach_tracking
from .group import main

LOG_LEVELS = ["DEBUG", "INFO", "WARNING", "ERROR"]


@main.command()
@click.option("--pipeline", default="support", show_default=True, help="Pipeline name (its attributes' name:).")
@click.option("--profile", default="quick", show_default=True, help="Profile of overrides from the YAML; '' for none.")
@click.option(
    "--defs-module",
    default=None,
    help="Definitions module to find the pipeline in. Default: the Dagster project in the current "
    "directory (pyproject.toml), else dragon_dagster.definitions.",
)
@click.option(
    "--fresh",
    is_flag=True,
    help="Make every stage anew, even where an earlier run made the same thing (same settings, same inputs).",
)
@click.option(
    "--verbose",
    "-v",
    is_flag=True,
    help="Show the run's log lines too, each training step's figures among them (--log-level INFO).",
)
@click.option(
    "--log-level",
    type=click.Choice(LOG_LEVELS, case_sensitive=False),
    default="WARNING",
    show_default=True,
    envvar="DRAGON_LOG_LEVEL",
    help="The run's records the terminal shows besides a line per stage: INFO adds each stage's log lines (every "
    "training step's figures), DEBUG Dagster's own events. Also DRAGON_LOG_LEVEL. The run's event log and MLflow "
    "keep everything either way.",
)
def demo(pipeline: str, profile: str, defs_module: str | None, fresh: bool, verbose: bool, log_level: str):
    """Materialize a whole pipeline end to end: a line per stage as it ends (a progress bar while it runs),
    then a table of the stages, the checks' verdicts, the report's and where to look next.

    A stage whose settings and inputs have not changed since a run made it is reused, not trained again (the
    table says so); --fresh makes everything anew. A pipeline without the asked profile runs without one (and
    says so)."""
    ensure_dagster_home()
    reach_tracking()
    from ..assets.launch import find_pipeline, load_definitions, materialize_pipeline
    from ..engine.runtime import library_noise
    from ..engine.runtime.warm import client as warm

    log_level = log_level.upper()
    if verbose and LOG_LEVELS.index(log_level) > LOG_LEVELS.index("INFO"):
        log_level = "INFO"
    # the stage lines draw the progress: the libraries' own bars (here and in the workers) would scribble over them
    os.environ[library_noise.BARS_ENV] = "off"
    library_noise.hide_progress_bars(importing=False)
    started = time.time()
    warm.prestart(dict(os.environ))  # its imports overlap the dataset steps; the first training job forks from it
    found = find_pipeline(pipeline, load_definitions(defs_module))
    if profile and profile not in found.profiles:
        having = f"its profiles are {', '.join(sorted(found.profiles))}" if found.profiles else "it has none"
        click.echo(f"pipeline {pipeline!r} has no profile {profile!r} ({having}): running without a profile", err=True)
        profile = ""
    from ..assets.reuse import FRESH_TAG

    outcome = materialize_pipeline(
        found, profile or None, tags={FRESH_TAG: "true"} if fresh else None, log_level=log_level
    )
    table = Table(title=f"{pipeline} pipeline, profile {profile or 'none'}")
    for column in ("asset", "seconds", "status", "made", "checks"):
        table.add_column(column)
    for row in outcome["stages"]:
        made = f"reused (run {row['reused_from_run'][:8]})" if row.get("reused_from_run") else ""
        table.add_row(
            row["asset"],
            f"{row['seconds']:.1f}",
            row["status"],
            made or ("new" if row["artifact"] else ""),
            checks_cell([c for c in outcome["checks"] if c["asset"] == row["asset"]]),
        )
    console.print(table)
    reused = [row for row in outcome["stages"] if row.get("reused_from_run")]
    if reused:
        everything = len(reused) == sum(1 for row in outcome["stages"] if row["artifact"])
        console.print(
            f"{len(reused)} stage(s) reused: their settings and inputs have not changed since an earlier run made them"
            + (", so nothing was trained" if everything else "")
            + " (`--fresh` makes them anew; `dragon status` says what is out of date)."
        )
    console.print(
        f"total {time.time() - started:.1f} s; Dagster run {outcome['run_id']}; each stage's folder: "
        f"`dragon runs --pipeline {found.name}`",
        soft_wrap=True,
        markup=False,
    )
    for check in outcome["checks"]:  # the table counts the passes; a failure or a warning says why, in a line
        if not check["passed"]:  # a failed WARN check is a warning: the run went on, its figures are worth a look
            verdict = "FAILED" if check["severity"] == "ERROR" else "warning"
            why = f" - {one_line(check['description'])}" if check.get("description") else ""
            console.print(f"check {check['asset']} {check['name']}: {verdict}{why}", soft_wrap=True, markup=False)
    if outcome.get("report"):
        console.print(f"evaluation report: {outcome['report']}/report.md")
        for line in pass_at_k_lines(outcome["report"]):
            console.print(line, soft_wrap=True, markup=False)
    print_registry(found.name)
    print_exports(outcome["stages"])
    from ..resources.tracking import MLflowTracking, dagster_ui_url

    tracking = MLflowTracking()
    console.print(f"Open the UIs with `make ui`: Dagster {dagster_ui_url()}, MLflow {tracking.ui}", soft_wrap=True)
    # its run page: Dagster's Overview timeline shows only runs launched through a code location (the UI, a sensor,
    # a schedule), and this one ran in this process
    console.print(
        f"This run's steps, logs and checks in Dagster: {dagster_ui_url()}/runs/{outcome['run_id']}",
        soft_wrap=True,
        markup=False,
    )
    for what, url in (
        ("Compare the runs (each pipeline run, its stages nested under it)", tracking.runs_url(found.name)),
        ("Base and merged side by side, row by row", evaluation_link(outcome.get("report"))),
        ("The system prompt's versions and which is live", found.system_prompt() and tracking.prompt_url(found.name)),
        ("Every chat turn (`dragon chat`) as a trace, ratings on it", tracking.ui_page(found.name, "traces")),
    ):
        if url:
            console.print(f"{what} in MLflow: {url}", soft_wrap=True, markup=False)
    if not outcome["success"]:
        raise SystemExit(1)


def checks_cell(checks: list[dict]) -> str:
    """A stage's checks in its table row: how many passed, the others by name ("2 passed", "1 passed, leak FAILED")."""
    passed = sum(1 for c in checks if c["passed"])
    others = [f"{c['name']} {'FAILED' if c['severity'] == 'ERROR' else 'warning'}" for c in checks if not c["passed"]]
    return ", ".join(([f"{passed} passed"] if passed else []) + others)


def pass_at_k_lines(report_dir: str) -> list[str]:
    """The report's pass@1 and pass@k rows in a line each: what a sampling stage changed, and the verdict."""
    from ..engine.stages.evaluate.result import ReportResult

    try:
        report = ReportResult.model_validate_json((Path(report_dir) / "report.json").read_text())
    except (OSError, ValueError):
        return []
    return [
        f"pass@k: {c.model} against {c.compared_with()}, {c.reward} on {c.prompts} "
        f"held-out prompts x {c.samples} samples: pass@1 {c.pass1_before:.3f} -> {c.pass1_after:.3f}, pass@{c.k} "
        f"{c.passk_before:.3f} -> {c.passk_after:.3f} ({c.prompts_up} prompts up, {c.prompts_down} down, sign test "
        f"p = {c.p_value:.3g}): {c.verdict}"
        for c in report.pass_at_k
    ]


def evaluation_link(report_dir: str | None) -> str | None:
    """The report's MLflow evaluation link (the merged run compared to the base run, both selected), if it has one."""
    if not report_dir:
        return None
    try:
        report = json.loads((Path(report_dir) / "report.json").read_text())
    except (OSError, ValueError):
        return None
    return ((report or {}).get("mlflow_evaluation") or {}).get("url")


def print_registry(pipeline: str) -> None:
    """Which registered versions the demo left as champion and challenger."""
    from ..engine.release.model_registry import CHALLENGER, CHAMPION, alias_version
    from ..resources.tracking import MLflowTracking

    client = MLflowTracking().client()
    versions = {alias: alias_version(client, pipeline, alias) for alias in (CHAMPION, CHALLENGER)}
    console.print(
        "; ".join(
            f"models:/{pipeline}@{alias}: " + (f"version {v}" if v else "none yet") for alias, v in versions.items()
        )
    )


def print_exports(stages: list[dict]) -> None:
    """Where the demo's GGUF files and Modelfile are, and the line that makes them an Ollama model."""
    from ..engine.artifacts.manifest import ExportManifest, manifest_kind, read_manifest

    for row in stages:
        if row.get("artifact") and manifest_kind(row["artifact"]) == "gguf_export":
            manifest = read_manifest(row["artifact"], ExportManifest)
            for f in manifest.files:
                console.print(f"GGUF {f.format}: {f.path}", soft_wrap=True, markup=False)
            if manifest.ollama_create:
                console.print(f"Ollama: {manifest.ollama_create}", soft_wrap=True, markup=False)


@main.command()
@pipeline_argument
@click.option("--pipeline", default=None, help="Pipeline name (or give it as the first argument).")
@click.option(
    "--defs-module",
    default=None,
    help="Definitions module to find the pipeline in. Default: the Dagster project in the current "
    "directory (pyproject.toml), else dragon_dagster.definitions.",
)
def status(pipeline: str, defs_module: str | None):
    """Which stages of PIPELINE are out of date, and why: Dagster's "unsynced", from its instance.

    A stage is unsynced when its version changed since it was made (its settings, a file it reads, the base
    model, its kind's code) or a stage it reads was made again or is unsynced; `dragon demo` then makes only
    those, and reuses the rest."""
    ensure_dagster_home()
    from dagster import DagsterInstance

    from ..assets.factory import build_pipeline_defs
    from ..assets.launch import find_pipeline, load_definitions
    from ..assets.status import stage_states

    found = find_pipeline(pipeline, load_definitions(defs_module))
    states = stage_states(found, build_pipeline_defs(found)["assets"], DagsterInstance.get())
    table = Table(title=f"{found.name}: stages against the Dagster instance at {os.environ['DAGSTER_HOME']}")
    for column in ("stage", "status", "version", "why"):
        table.add_column(column)
    for state in states:
        table.add_row(state.name, state.status, state.code_version or "", "; ".join(state.reasons))
    console.print(table)
    behind = [s.name for s in states if s.status != "fresh"]
    console.print(
        f"{len(behind)} of {len(states)} out of date or never made: {', '.join(behind)}"
        if behind
        else "every stage is up to date: a run with the settings that made them reuses them all"
    )
