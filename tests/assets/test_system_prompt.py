"""The pipeline's system prompt in MLflow's Prompt Registry, on a real `mlflow server`: registered by the dataset
that holds it, linked to the runs that train and evaluate with it, the live alias moved by a person and picked
up by chat, export and evaluation, and a changed YAML text a new live version."""

import json
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner
from dagster import DagsterInstance
from mlflow import MlflowClient

from dragon_dagster.assets.launch import materialize_pipeline
from dragon_dagster.chat_target import system_prompt
from dragon_dagster.cli import main
from dragon_dagster.engine.data.tables import read_jsonl
from dragon_dagster.engine.pipeline import load
from dragon_dagster.engine.release.prompt_registry import live_prompt, prompt_name, versions_of
from tests.support import TINY_ARGS, component_yaml

FIRST = "You are the tiny support bot of a smart-home company."
SECOND = "You are a terse bot. Answer in five words."


def write(directory: Path, model: Path, system: str) -> Path:
    path = directory / "prompted" / "defs.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        component_yaml(
            textwrap.dedent(f"""\
        name: prompted
        model: {model}
        datasets:
          tickets: {{path: "example:tickets.csv"}}
        stages:
          - {{name: sft_dataset, kind: chat_dataset, source: tickets, prompt: "{{subject}}", response: reply,
              system: "{system}", group_by: subject}}
          - {{name: sft_adapter, kind: sft, dataset: sft_dataset, args: {TINY_ARGS}, n_samples: 1, max_new_tokens: 4}}
          - {{name: merged_model, kind: merge}}
          - {{name: evaluation_report, kind: evaluate, dataset: sft_dataset, max_new_tokens: 4, n_samples: 1,
              n_judge: 0, max_eval_rows: 4}}
          - {{name: gguf_export, kind: export, formats: [f16]}}
        """)
        )
    )
    return path


def manifest(directory: str) -> dict:
    return json.loads((Path(directory) / "manifest.json").read_text())


@pytest.mark.slow  # a tiny chain and two re-materializations against a server: about 2-3 minutes on 2 cores
def test_the_system_prompt_is_versioned_linked_and_its_live_alias_is_what_everything_sends(
    mlflow_server, tiny_model, tmp_path, monkeypatch, resources_for
):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server["url"])
    monkeypatch.setenv("DRAGON_RUNS_DIR", str(tmp_path / "runs"))
    client = MlflowClient(mlflow_server["url"])
    resources = resources_for(tmp_path / "runs")
    instance = DagsterInstance.ephemeral()
    pipeline = load(write(tmp_path / "defs", tiny_model, FIRST))
    name = prompt_name("prompted")

    outcome = materialize_pipeline(pipeline, resources=resources, instance=instance)
    assert outcome["success"], outcome
    artifacts = {s["asset"].split("/")[-1]: s["artifact"] for s in outcome["stages"]}
    live = live_prompt(client, "prompted")
    assert (live.version, live.text) == (1, FIRST)
    assert manifest(artifacts["sft_dataset"])["system_prompt_uri"] == f"prompts:/{name}/1"
    sft_run = manifest(artifacts["sft_adapter"])["mlflow_run_id"]
    assert client.get_run(sft_run).data.tags["system_prompt"] == f"prompts:/{name}/1"
    linked = json.loads(client.get_run(sft_run).data.tags["mlflow.linkedPrompts"])  # the run page's prompts
    assert [(p["name"], int(p["version"])) for p in linked] == [(name, 1)]
    export = manifest(artifacts["gguf_export"])
    assert (export["system"], export["system_prompt_uri"]) == (FIRST, f"prompts:/{name}/1")
    report_run = manifest(artifacts["evaluation_report"])["mlflow_run_id"]
    assert client.get_run(report_run).data.tags["system_prompt"] == f"prompts:/{name}/1"

    # a person registers a new text and makes it live: chat, then export and evaluation, send it
    runner = CliRunner()
    made = runner.invoke(main, ["prompt", "prompted", "--register", SECOND, "--set-live", "2"])
    assert made.exit_code == 0, made.output
    assert f"prompts:/{name}/2 is now live" in made.output
    assert system_prompt("prompted", None, None, pipeline) == (SECOND, f"prompts:/{name}/2")
    assert system_prompt("prompted", "Be brief.", None, pipeline) == ("Be brief.", None)  # --system wins
    again = materialize_pipeline(
        pipeline, resources=resources, instance=instance, only=["evaluation_report", "gguf_export"]
    )
    assert again["success"], again
    redone = {s["asset"].split("/")[-1]: s["artifact"] for s in again["stages"] if s["artifact"]}
    export = manifest(redone["gguf_export"])
    assert (export["system"], export["system_prompt_uri"]) == (SECOND, f"prompts:/{name}/2")
    modelfile = next(Path(redone["gguf_export"]).rglob("Modelfile")).read_text()
    assert SECOND in modelfile and FIRST not in modelfile
    rows = read_jsonl(Path(redone["evaluation_report"]) / "eval.jsonl")  # the held-out rows as evaluated
    assert rows and all(r["prompt"][0] == {"role": "system", "content": SECOND} for r in rows)
    report_run = manifest(redone["evaluation_report"])["mlflow_run_id"]
    assert client.get_run(report_run).data.tags["system_prompt"] == f"prompts:/{name}/2"

    # rebuilding the dataset with the same YAML text moves nothing; a changed text is a new live version
    assert materialize_pipeline(pipeline, resources=resources, instance=instance, only=["sft_dataset"])["success"]
    assert [p.version for p in versions_of(client, "prompted")] == [2, 1]
    assert live_prompt(client, "prompted").version == 2
    changed = load(write(tmp_path / "defs", tiny_model, FIRST + " Be kind."))
    rebuilt = materialize_pipeline(changed, resources=resources, instance=instance, only=["sft_dataset"])
    assert rebuilt["success"], rebuilt
    live = live_prompt(client, "prompted")
    assert (live.version, live.text) == (3, FIRST + " Be kind.")
    shown = runner.invoke(main, ["prompt", "prompted"])
    assert shown.exit_code == 0 and f"prompts:/{name}/3  <- live" in shown.output


def test_an_unknown_version_is_refused_with_the_versions_there_are(mlflow_server, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server["url"])
    runner = CliRunner()
    unregistered = runner.invoke(main, ["prompt", "never_built"])
    assert unregistered.exit_code == 0 and "never_built-system is not registered yet" in unregistered.output
    made = runner.invoke(main, ["prompt", "refusing", "--register", "Hello."])
    assert made.exit_code == 0 and "registered prompts:/refusing-system/1" in made.output
    again = runner.invoke(main, ["prompt", "refusing", "--register", "Hello."])
    assert "already registered as prompts:/refusing-system/1" in again.output
    wrong = runner.invoke(main, ["prompt", "refusing", "--set-live", "4"])
    assert wrong.exit_code != 0 and "has no version 4; it has [1]" in wrong.output
