"""Change one setting, retrain only what it touches (issue 42), through Dagster on the tiny model: the stages a change
makes out of date are unsynced with Dagster's reason, a run makes only those and reuses the rest (the same artifact,
no worker, no MLflow run), an unchanged pipeline trains nothing, `dragon/fresh` makes a stage anew, and an edited
row of a source file makes its dataset and what follows unsynced, nothing else. In MLflow (issue 58) the two
pipeline runs' params differ in exactly the changed setting, each stage's version is the one Dagster shows, and the
registered version is made from the merge's logged model."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pandas as pd
from dagster import AssetKey, DagsterInstance

from dragon_dagster.assets.factory import build_pipeline_defs
from dragon_dagster.assets.launch import materialize_pipeline
from dragon_dagster.assets.reuse import FRESH_TAG, REUSED_TAG
from dragon_dagster.assets.status import stage_states
from dragon_dagster.engine.pipeline import load
from dragon_dagster.engine.release.model_registry import version_for
from dragon_dagster.engine.run_diff import differences, pipeline_run_settings

STEPS = "{max_steps: 2, batch_size: 2, grad_accum: 1, logging_steps: 1, max_seq_len: 96, learning_rate: 1.0e-3}"
EXAMPLES = Path(__file__).resolve().parents[2] / "dragon_dagster" / "example_data"


def write(folder: Path, model: Path, beta: float) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "defs.yaml").write_text(
        textwrap.dedent(f"""\
        name: small
        model: {model}
        datasets:
          tickets: {{path: tickets.csv}}
          pairs_file: {{path: pairs.parquet}}
        stages:
          - {{name: sft_dataset, kind: chat_dataset, source: tickets, prompt: subject, response: reply}}
          - {{name: sft_adapter, kind: sft, dataset: sft_dataset, args: {STEPS}, n_samples: 1, max_new_tokens: 2}}
          - {{name: pairs, kind: pairs_dataset, source: pairs_file, prompt: "{{subject}}", chosen: reply,
              rejected: bad, eval_frac: 0.2}}
          - {{name: dpo_adapter, kind: dpo, dataset: pairs, beta: {beta}, args: {STEPS}, n_samples: 1,
              max_new_tokens: 2}}
          - {{name: merged_model, kind: merge}}
        """)
    )
    return folder / "defs.yaml"


def states(pipeline, instance) -> dict[str, tuple[str, list[str]]]:
    return {
        s.name: (s.status, s.reasons) for s in stage_states(pipeline, build_pipeline_defs(pipeline)["assets"], instance)
    }


def made(outcome) -> dict[str, str | None]:
    """Each stage's artifact, and whether this run made it (None) or reused it (the run that made it)."""
    return {row["asset"].split("/")[1]: row["reused_from_run"] for row in outcome["stages"]}


def pipeline_params(client, experiment: str, dagster_run_id: str) -> dict[str, str]:
    [parent] = client.search_runs([experiment], f"tags.dagster_run_id = '{dagster_run_id}' and tags.level = 'pipeline'")
    return parent.data.params


def parent_of(client, experiment: str, dagster_run_id: str, stage: str) -> str:
    [run] = client.search_runs([experiment], f"tags.dagster_run_id = '{dagster_run_id}' and tags.stage = '{stage}'")
    return run.info.run_id


def test_one_changed_setting_retrains_only_what_it_touches(tiny_model, tmp_path, resources_for):
    df = pd.read_csv(EXAMPLES / "tickets.csv").head(30)
    (tmp_path / "p").mkdir()
    df.to_csv(tmp_path / "p" / "tickets.csv", index=False)
    df.assign(bad=df["product"] + " is not supported.").to_parquet(tmp_path / "p" / "pairs.parquet")
    instance, resources = DagsterInstance.ephemeral(), resources_for(tmp_path / "runs")

    first = materialize_pipeline(load(write(tmp_path / "p", tiny_model, 0.1)), resources=resources, instance=instance)
    assert first["success"] and not any(made(first).values())  # everything made
    pipeline = load(write(tmp_path / "p", tiny_model, 0.2))  # one setting changed
    now = states(pipeline, instance)
    assert {n for n, (status, _) in now.items() if status != "fresh"} == {"dpo_adapter", "merged_model"}
    assert any("code version" in why for why in now["dpo_adapter"][1]), now["dpo_adapter"]
    assert any("dpo_adapter" in why for why in now["merged_model"][1]), now["merged_model"]

    second = materialize_pipeline(pipeline, resources=resources, instance=instance)
    assert second["success"]
    reused = {name for name, by in made(second).items() if by}
    assert reused == {"tickets", "pairs_file", "sft_dataset", "pairs", "sft_adapter"}
    assert made(second)["sft_adapter"] == first["run_id"]
    assert second["artifacts"]["sft_adapter"] == first["artifacts"]["sft_adapter"]  # the same artifact, not a copy
    assert second["artifacts"]["dpo_adapter"] != first["artifacts"]["dpo_adapter"]
    tracking = resources["tracking"]
    client = tracking.client()
    experiment = tracking.experiment_id("small")
    assert len(client.search_runs([experiment], "tags.stage = 'sft_adapter'")) == 1  # no worker ran for it
    assert len(client.search_runs([experiment], "tags.stage = 'dpo_adapter'")) == 2
    [parent] = client.search_runs(
        [experiment], f"tags.dagster_run_id = '{second['run_id']}' and tags.level = 'pipeline'"
    )
    assert parent.data.tags["reused.sft_adapter"] == first["run_id"]
    assert {"version.sft_adapter", "version.dpo_adapter", "version.merged_model"} <= set(parent.data.tags)
    assert {status for status, _ in states(pipeline, instance).values()} == {"fresh"}
    # MLflow's compare view with "show diff only" on the two pipeline runs: their params are every stage's
    # settings, and they differ in exactly the one that changed, reused stages' settings included
    params = {o["run_id"]: pipeline_params(client, experiment, o["run_id"]) for o in (first, second)}
    before, after = params[first["run_id"]], params[second["run_id"]]
    assert {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)} == {"dpo_adapter.beta"}
    assert (before["dpo_adapter.beta"], after["dpo_adapter.beta"]) == ("0.1", "0.2")
    assert after["sft_adapter.args.max_steps"] == "2" and after["pairs.eval_frac"] == "0.2"
    # one version per stage: the pipeline run's is the one Dagster and `dragon status` show
    shown = {s.name: s.code_version for s in stage_states(pipeline, build_pipeline_defs(pipeline)["assets"], instance)}
    versions = {k.split(".", 1)[1]: v for k, v in parent.data.tags.items() if k.startswith("version.")}
    assert versions == {n: shown[n] for n in ("sft_dataset", "sft_adapter", "pairs", "dpo_adapter", "merged_model")}
    # the reused stages say so on their Dagster materializations too
    event = instance.get_latest_materialization_event(AssetKey(["small", "sft_adapter"]))
    assert event.asset_materialization.tags[REUSED_TAG] == first["run_id"]
    # the registered version is made from the merge's logged model, which lists it
    merge_run = client.get_run(parent_of(client, experiment, second["run_id"], "merged_model"))
    [output] = merge_run.outputs.model_outputs
    version = client.get_model_version("small", version_for(client, "small", Path(second["artifacts"]["merged_model"])))
    assert version.source == f"models:/{output.model_id}" and version.run_id == merge_run.info.run_id
    linked = json.loads(client.get_logged_model(output.model_id).tags["mlflow.modelVersions"])
    assert linked == [{"name": "small", "version": 2}] and str(version.version) == "2"
    # the two runs told apart setting by setting (`dragon compare small --runs A B`): the reused SFT stage's settings
    # are read from the run that made it, so only the changed setting and its stage's version differ
    a, b = (pipeline_run_settings(client, experiment, o["run_id"][:8]) for o in (first, second))
    assert a.settings["sft_adapter.max_new_tokens"] == b.settings["sft_adapter.max_new_tokens"] == "2"
    assert differences(a, b) == [
        ("dpo_adapter.beta", "0.1", "0.2"),
        ("version of dpo_adapter", a.versions["dpo_adapter"], b.versions["dpo_adapter"]),
    ]

    # unchanged: nothing is made, and nothing is out of date
    third = materialize_pipeline(pipeline, resources=resources, instance=instance)
    assert third["success"] and all(made(third).values())
    assert third["artifacts"] == second["artifacts"]
    assert len(client.search_runs([experiment], "tags.stage = 'dpo_adapter'")) == 2

    # a fresh run makes the stage anew; what reads it is then out of date (its input is another artifact)
    fresh = materialize_pipeline(
        pipeline,
        resources=resources,
        instance=instance,
        only=["sft_adapter"],
        tags={FRESH_TAG: "true"},
        extra_config={"small__sft_adapter": {"max_new_tokens": 3}},  # a launchpad value: a param, not a version
    )
    assert fresh["success"] and not made(fresh)["sft_adapter"]
    fresh_parent = client.get_run(
        client.get_run(parent_of(client, experiment, fresh["run_id"], "sft_adapter")).data.tags["mlflow.parentRunId"]
    )
    assert (
        fresh_parent.data.params["sft_adapter.max_new_tokens"] == "3"
        and "dpo_adapter.beta" not in fresh_parent.data.params
    )
    assert fresh_parent.data.tags["version.sft_adapter"] == shown["sft_adapter"]
    assert fresh["artifacts"]["sft_adapter"] != second["artifacts"]["sft_adapter"]
    assert {n for n, (status, _) in states(pipeline, instance).items() if status != "fresh"} == {
        "dpo_adapter",
        "merged_model",
    }

    # one row of the source file edited: its snapshot and what is made from it are out of date, the pairs are not
    df.loc[3, "reply"] = "An edited reply."
    df.to_csv(tmp_path / "p" / "tickets.csv", index=False)
    now = states(load(tmp_path / "p" / "defs.yaml"), instance)
    assert {n for n, (status, _) in now.items() if status != "fresh"} == {
        "tickets",
        "sft_dataset",
        "sft_adapter",
        "dpo_adapter",
        "merged_model",
    }
    assert any("code version" in why for why in now["tickets"][1])
