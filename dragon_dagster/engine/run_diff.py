"""Two pipeline runs told apart setting by setting, read from MLflow: what `dragon compare --runs A B` prints.

A pipeline run's MLflow run carries every stage's effective settings as params (`<stage>.<setting>`), each stage's
version (`version.<stage>`) and the stages it reused (`reused.<stage>`: the Dagster run that made them). A run
logged before the pipeline run had the settings has them on each stage's own run: a reused stage, which has no run
of its own in the pipeline run, is then read from the run that made it.

MLflow keeps each value as text; two runs are compared on the values read back with the type of the field their
path names in the stage's kind's model (`<stage>.kind` is logged too), so `2e-4` and `0.0002` are the same
learning rate, and a setting of a kind or field no longer known is compared as the text it was logged as.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import TypeAdapter, ValidationError

from . import catalog
from .config.settings import field_at

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

    def value(self, key: str) -> Any:
        """The setting `<stage>.<path>` as its field's type reads the logged text (the text where it cannot)."""
        text = self.settings.get(key)
        stage, _, path = key.partition(".")
        kind = self.settings.get(f"{stage}.kind")
        if text is None or kind not in catalog.KINDS or not path:
            return text
        info = field_at(catalog.get(kind).settings, path)
        if info is None:
            return text
        adapter = TypeAdapter(Annotated[info.annotation, *info.metadata] if info.metadata else info.annotation)
        for candidate in _readings(text):
            try:
                return adapter.validate_python(candidate)
            except ValidationError:
                continue
        return text


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


def _readings(text: str) -> list[Any]:
    """What a logged text may have been: None (logged as "None"), a JSON value (a list), or the text itself."""
    if text == "None":
        return [None, text]
    try:
        return [json.loads(text), text]
    except ValueError:
        return [text]


def differences(a: PipelineRunSettings, b: PipelineRunSettings) -> list[tuple[str, str | None, str | None]]:
    """(what, in a, in b) for every setting and stage version that differs, settings first: settings by their
    typed values, shown as logged."""
    rows = []
    for key in sorted(set(a.settings) | set(b.settings)):
        if a.value(key) != b.value(key):
            rows.append((key, a.settings.get(key), b.settings.get(key)))
    for key in sorted(set(a.versions) | set(b.versions)):
        if a.versions.get(key) != b.versions.get(key):
            rows.append((f"version of {key}", a.versions.get(key), b.versions.get(key)))
    return rows
