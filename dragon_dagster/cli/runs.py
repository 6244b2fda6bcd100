"""Runs and their artifacts: sweeps submitted, runs compared, artifacts listed, archived, restored and pruned."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.table import Table

from .common import console, ensure_dagster_home, fmt, reach_tracking, runs_dir
from .group import main


@main.command()
@click.argument("pipeline")
@click.argument("name")
@click.option(
    "--dagster-url",
    default=None,
    help="The Dagster UI, for the runs' links. Default: $DAGSTER_UI_URL, else where `make ui` serves it "
    "(http://127.0.0.1:$DAGSTER_PORT, port 3000 by default).",
)
@click.option(
    "--here",
    is_flag=True,
    help="Run the points one after another in this process (as `dragon demo` does), not through the run queue.",
)
@click.option("--defs-module", default=None, help="With --here: the definitions module (as for `dragon demo`).")
def sweep(pipeline: str, name: str, dagster_url: str | None, here: bool, defs_module: str | None):
    """Submit every point of sweep NAME of PIPELINE (its `sweeps:` in the YAML) as a run of the pipeline's job.

    The runs queue in the Dagster instance and take the training pool one at a time; `make ui` (`dagster dev`, whose
    daemon starts queued runs) runs them. The code location is the one `dagster dev` loads in this directory.
    `dragon compare PIPELINE --sweep NAME` ranks them."""
    ensure_dagster_home()
    reach_tracking()
    from dagster import DagsterInstance

    from ..assets.sweep import run_sweep_here, submit_sweep
    from ..resources.tracking import dagster_ui_url

    dagster_url = dagster_url or dagster_ui_url()
    with DagsterInstance.get() as instance:
        if here:
            from ..assets.launch import find_pipeline, load_definitions

            found = find_pipeline(pipeline, load_definitions(defs_module))
            tag, outcomes = run_sweep_here(found, name, instance)
            submitted = [(point, outcome["run_id"]) for point, outcome in outcomes]
            failed = [point.index for point, outcome in outcomes if not outcome["success"]]
        else:
            found, tag, submitted = submit_sweep(instance, pipeline, name)
    spec = found.sweep(name)
    console.print(f"sweep {tag}: {len(submitted)} points ({spec.method}), ranked by {spec.metric} ({spec.goal})")
    for point, run_id in submitted:
        settings = ", ".join(f"{k}={v}" for k, v in point.settings.items())
        console.print(f"point {point.index}: {settings}", soft_wrap=True, markup=False)
        console.print(f"  run {run_id}  {dagster_url.rstrip('/')}/runs/{run_id}", soft_wrap=True, markup=False)
    queued = "" if here else "queued: `make ui` runs them one at a time. "
    console.print(
        f"{queued}Compare: dragon compare {pipeline} --sweep {tag.split('/')[-1]}", soft_wrap=True, markup=False
    )
    if here and failed:
        console.print(f"points that failed: {failed}", markup=False)
        raise SystemExit(1)


@main.command()
@click.argument("pipeline_name", metavar="[PIPELINE]", required=False)
@click.option("--pipeline", default=None, help="Only this pipeline's experiment (or give PIPELINE).")
@click.option(
    "--sweep",
    "sweep_ref",
    default=None,
    metavar="ID|NAME",
    help="One row per point of a sweep of PIPELINE (its id, or its name for the latest submission), the best named.",
)
@click.option(
    "--runs",
    "run_pair",
    nargs=2,
    default=None,
    metavar="A B",
    help="Two pipeline runs of PIPELINE (Dagster run ids, or their first characters): the settings and stage "
    "versions that differ, beside their figures.",
)
@click.option("--tracking-uri", default=None, help="MLflow tracking URI (default: the runs dir's sqlite store).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def compare(
    pipeline_name: str | None,
    pipeline: str | None,
    sweep_ref: str | None,
    run_pair: tuple[str, str] | None,
    tracking_uri: str | None,
    as_json,
):
    """Every run's figures, read from MLflow: base, each stage and each report side by side; with --sweep, a
    sweep's points ranked by its metric; with --runs A B, what differs between two pipeline runs."""
    reach_tracking(tracking_uri, "--tracking-uri")
    from ..resources.tracking import MLflowTracking

    pipeline = pipeline_name or pipeline
    tracking = MLflowTracking(tracking_uri=tracking_uri or "")
    if run_pair:
        if not pipeline:
            raise click.UsageError("--runs needs the pipeline: dragon compare PIPELINE --runs A B")
        return compare_runs(tracking, pipeline, *run_pair, as_json)
    if sweep_ref is not None:
        if not pipeline:
            raise click.UsageError("--sweep needs the pipeline: dragon compare PIPELINE --sweep ID|NAME")
        return compare_sweep(pipeline, sweep_ref, tracking.uri, as_json)
    from ..engine.runs import comparison

    rows = comparison(tracking.uri, pipeline)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    # eval/loss lines SFT, DPO, the base and the report up; headline is each stage's own figures (GRPO rewards,
    # DPO preference accuracy, task metrics); --json has every metric
    columns = ["experiment", "run", "stage", "status", "eval/loss", "headline", "upstream", "started"]
    table = Table(title="runs in MLflow")
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*[fmt(row.get(c)) for c in columns])
    console.print(table)


def compare_runs(tracking, pipeline: str, a: str, b: str, as_json: bool) -> None:
    """What differs between two pipeline runs (settings, then stage versions), and their figures side by side."""
    import dataclasses

    from ..engine.run_diff import differences, pipeline_run_settings

    client, experiment = tracking.client(), tracking.experiment_id(pipeline)
    left, right = (pipeline_run_settings(client, experiment, ref) for ref in (a, b))
    rows = differences(left, right)
    if as_json:
        click.echo(json.dumps({"a": dataclasses.asdict(left), "b": dataclasses.asdict(right), "differ": rows}))
        return
    names = [f"{run.run_name} ({run.dagster_run_id[:8]})" for run in (left, right)]
    table = Table(title=f"{pipeline}: what differs between two pipeline runs")
    for column in ("setting", *names):
        table.add_column(column)
    for what, x, y in rows:
        table.add_row(what, fmt(x), fmt(y))
    for metric in sorted(set(left.figures) | set(right.figures)):
        table.add_row(f"[figure] {metric}", fmt(left.figures.get(metric)), fmt(right.figures.get(metric)))
    console.print(table)
    if not rows:
        console.print("the two runs ran the same settings at the same stage versions")


def compare_sweep(pipeline: str, ref: str, tracking_uri: str, as_json: bool) -> None:
    """A sweep's points (from the Dagster instance's run tags) with their metric (from MLflow), the best named."""
    ensure_dagster_home()
    from dagster import DagsterInstance

    from ..assets.sweep import sweep_comparison

    with DagsterInstance.get() as instance:
        found = sweep_comparison(instance, tracking_uri, pipeline, ref)
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    keys = list(dict.fromkeys(k for row in found["rows"] for k in row["settings"]))
    table = Table(title=f"sweep {found['sweep']}: {found['metric']} of {found['stage']} ({found['goal']})")
    for column in ["point", *keys, found["metric"], "status", "dagster run"]:
        table.add_column(column)
    best = found["best"]
    for row in found["rows"]:
        mark = " *" if best is not None and row["point"] == best["point"] else ""
        table.add_row(
            f"{row['point']}{mark}",
            *[fmt(row["settings"].get(k)) for k in keys],
            fmt(row["metric"]),
            row["status"],
            row["dagster_run_id"],
        )
    console.print(table)
    if best is None:
        console.print(f"no point has logged {found['metric']} yet")
        return
    settings = ", ".join(f"{k}={v}" for k, v in best["settings"].items())
    console.print(
        f"best: point {best['point']} ({settings}): {found['metric']} {fmt(best['metric'])}, "
        f"Dagster run {best['dagster_run_id']}",
        soft_wrap=True,
        markup=False,
    )


@main.command()
@click.option("--pipeline", default=None)
@click.option(
    "--prune",
    is_flag=True,
    help="Show the artifact directories that no current materialization, registered model version or "
    "running job refers to; with --yes, remove them.",
)
@click.option("--yes", is_flag=True, help="With --prune: remove what it shows.")
@click.option(
    "--archive",
    "to_archive",
    default=None,
    metavar="DIR",
    help="Move an artifact (its directory, or <pipeline>/<stage>/<id>) under archived/: every file kept, gone from "
    "the lists and from what a run reuses. Refused while its run is going or another artifact reads it.",
)
@click.option("--force", is_flag=True, help="With --archive: archive it even though other artifacts read it.")
@click.option("--restore", "to_restore", default=None, metavar="ID", help="Move an archived artifact back.")
@click.option("--archived", "show_archived", is_flag=True, help="List the archived artifacts instead.")
def runs(
    pipeline: str | None,
    prune: bool,
    yes: bool,
    to_archive: str | None,
    force: bool,
    to_restore: str | None,
    show_archived: bool,
):
    """Materialized artifacts, newest first, with their directories; --archive and --restore move one out of the
    way and back; --prune removes what nothing refers to."""
    from ..engine import archive
    from ..engine.runs import list_artifacts

    if prune:
        return prune_artifacts(pipeline, yes)
    if to_archive:
        where = archive.archive(runs_dir(), to_archive, is_live=live_dagster_runs(), force=force)
        relative = where.relative_to(archive.archived_root(runs_dir()))
        click.echo(f"archived {relative} to {where}; `dragon runs --restore {relative}` brings it back")
        return
    if to_restore:
        click.echo(f"restored {archive.restore(runs_dir(), to_restore)}")
        return
    # plain lines rather than a table, so that directories are never cut and can be copied
    rows = archive.archived(runs_dir(), pipeline) if show_archived else list_artifacts(runs_dir(), pipeline)
    click.echo(f"{'asset':<32} {'kind':<18} {'created':<25} {'mlflow run':<34} directory")
    for row in rows:
        click.echo(
            f"{row['asset']:<32} {row['kind']:<18} {row['created']:<25} "
            f"{(row.get('mlflow_run_id') or '-'):<34} {row['dir']}"
        )
    if not rows:
        of = f" of pipeline {pipeline!r}" if pipeline else ""
        click.echo(f"(no artifacts{of} under {runs_dir() / ('archived' if show_archived else 'artifacts')})", err=True)


def live_dagster_runs():
    """is_live(dagster_run_id): whether that run is queued or going in the Dagster instance."""
    ensure_dagster_home()
    from dagster import DagsterInstance

    from ..assets.training import run_is_live

    return run_is_live(DagsterInstance.get())


def referenced_artifacts() -> set[Path]:
    """What must stay: the artifact of each asset's latest materialization in the Dagster instance, every
    artifact a registered model version was made from, and the artifacts of runs still going."""
    from dagster import DagsterInstance, RunsFilter

    from ..assets.automation import UNFINISHED
    from ..engine.artifacts.manifest import read_manifest
    from ..engine.runs import list_artifacts
    from ..resources.tracking import MLflowTracking

    ensure_dagster_home()
    reach_tracking()
    keep: set[Path] = set()
    with DagsterInstance.get() as instance:
        for key in instance.get_asset_keys():
            event = instance.get_latest_materialization_event(key)
            path = event and event.asset_materialization and event.asset_materialization.metadata.get("artifact_dir")
            if path is not None:
                keep.add(Path(str(path.value)))
        live = {r.run_id for r in instance.get_runs(RunsFilter(statuses=UNFINISHED))}
    keep |= {
        Path(r["dir"])
        for r in list_artifacts(runs_dir())
        if r["kind"] != "?" and read_manifest(r["dir"]).dagster_run_id in live
    }
    client = MLflowTracking().client()
    for version in client.search_model_versions(max_results=10000):
        if version.tags.get("artifact_dir"):
            keep.add(Path(version.tags["artifact_dir"]))
    return keep


def prune_artifacts(pipeline: str | None, yes: bool) -> None:
    from ..engine.artifacts.directories import dir_size, remove_tree
    from ..engine.runs import prunable

    removable, kept = prunable(runs_dir(), referenced_artifacts())
    if pipeline:
        removable = [d for d in removable if d.parent.parent.name == pipeline]
    sizes = {d: dir_size(d) for d in removable}
    for directory in removable:
        click.echo(f"{sizes[directory] / 1e6:>10.1f} MB  {directory}")
    total = sum(sizes.values()) / 1e6
    if not removable:
        click.echo(f"nothing to prune: every artifact is referred to ({len(kept)} kept)")
    elif not yes:
        click.echo(
            f"{len(removable)} artifact directories ({total:.1f} MB) are referred to by nothing; "
            f"{len(kept)} kept. Remove them with: dragon runs --prune --yes"
            + (f" --pipeline {pipeline}" if pipeline else "")
        )
    else:
        for directory in removable:
            remove_tree(directory)
        click.echo(f"removed {len(removable)} artifact directories ({total:.1f} MB); {len(kept)} kept")
