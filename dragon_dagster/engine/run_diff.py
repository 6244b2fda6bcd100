"""Two pipeline runs told apart setting by setting, read from MLflow: what `dragon compare --runs A B` prints.

A pipeline run's MLflow run carries every stage's effective settings as params (`<stage>.<setting>`), each stage's
version (`version.<stage>`) and the stages it reused (`reused.<stage>`: the Dagster run that made them). A run
logged before the pipeline run had the settings has them on each stage's own run: a reused stage, which has no run
of its own in the pipeline run, is then read from the run that made it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# params that say where or on what a run happened rather than what it was asked to do: an artifact path differs
# whenever the data was made again (the stage versions say when that changed anything), a machine is not a setting
NOT_SETTINGS = {"dataset", "merged", "hardware", "speed"}


@dataclass
class PipelineRunSettings:
    """One pipeline run as MLflow has it."""

    dagster_run_id: str
    run_name: str
    versions: dict[str, str] = field(default_factory=dict)
    reused: dict[str, str] = field(default_factory=dict)  # stage -> the Dagster run that made it
    settings: dict[str, str] = field(default_factory=dict)  # "stage.setting" -> value, as logged
    figures: dict[str, float] = field(default_factory=dict)  # the pipeline run's own metrics


def _one(client, experiment_id: str, query: str, what: str):
    runs = client.search_runs([experiment_id], query, order_by=["attributes.start_time DESC"], max_results=2)
    if not runs:
        raise ValueError(f"no {what} in MLflow")
    return runs[0]


def pipeline_run_settings(client, experiment_id: str, dagster_run_id: str) -> PipelineRunSettings:
    """dagster_run_id: a Dagster run id or its first characters (as `dragon demo` prints it)."""
    parent = _one(
        client,
        experiment_id,
        f"tags.level = 'pipeline' and tags.dagster_run_id LIKE '{dagster_run_id}%'",
        f"pipeline run for Dagster run {dagster_run_id!r} (`dragon compare PIPELINE` lists the runs)",
    )
    tags = parent.data.tags
    out = PipelineRunSettings(tags["dagster_run_id"], parent.info.run_name, figures=dict(parent.data.metrics))
    out.versions = {k.split(".", 1)[1]: v for k, v in tags.items() if k.startswith("version.")}
    out.reused = {k.split(".", 1)[1]: v for k, v in tags.items() if k.startswith("reused.")}
    out.settings = {k: v for k, v in parent.data.params.items() if "." in k}  # `<stage>.<setting>`: all of them
    if out.settings:
        return out
    stage_runs = client.search_runs([experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    by_stage = {r.data.tags.get("stage"): r for r in stage_runs if r.data.tags.get("stage")}
    for stage, made_by in out.reused.items():  # its settings are those of the run that made it
        if stage not in by_stage:
            found = client.search_runs(
                [experiment_id], f"tags.dagster_run_id = '{made_by}' and tags.stage = '{stage}'", max_results=1
            )
            if found:
                by_stage[stage] = found[0]
    for stage, run in sorted(by_stage.items()):
        out.settings.update({f"{stage}.{k}": v for k, v in run.data.params.items() if k not in NOT_SETTINGS})
    return out


def differences(a: PipelineRunSettings, b: PipelineRunSettings) -> list[tuple[str, str | None, str | None]]:
    """(what, in a, in b) for every setting and stage version that differs, settings first."""
    rows = []
    for kind, left, right in (("", a.settings, b.settings), ("version of ", a.versions, b.versions)):
        for key in sorted(set(left) | set(right)):
            if left.get(key) != right.get(key):
                rows.append((f"{kind}{key}", left.get(key), right.get(key)))
    return rows
