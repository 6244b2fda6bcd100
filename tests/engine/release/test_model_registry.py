"""The MLflow Model Registry as the source of truth for the live model, datasets and system metrics on the
training runs, and MLflow's own conventions (MLFLOW_TRACKING_URI, a real `mlflow server` on loopback)."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from dagster import AssetSelection, DagsterInstance, materialize

from dragon_dagster.assets.factory import build_pipeline_defs
from dragon_dagster.engine.pipeline import load
from dragon_dagster.engine.release.model_registry import (
    CHALLENGER,
    CHAMPION,
    ModelRef,
    RegistryError,
    alias_version,
    model_dir,
    parse_uri,
    version_for,
)
from dragon_dagster.resources import MLflowTracking
from tests.support import free_port, write_pipeline


def runs_of(client, experiment: str) -> dict:
    """The latest run of each stage in an experiment, by stage tag."""
    exp = client.get_experiment_by_name(experiment)
    found = {}
    for run in client.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"]):
        found[run.data.tags.get("stage")] = run
    return found


def test_a_merged_model_is_a_registered_version_and_the_passing_report_makes_it_champion(materialized):
    tracking, outcome = materialized["tracking"], materialized["outcome"]
    client = tracking.client()
    merged = Path(outcome["artifacts"]["merged_model"])
    version = version_for(client, "tiny", merged)
    registered = client.get_model_version("tiny", version)
    sft = json.loads((Path(outcome["artifacts"]["sft_adapter"]) / "manifest.json").read_text())
    merge = json.loads((merged / "manifest.json").read_text())
    assert registered.run_id == merge["mlflow_run_id"], "logged on the merge's own run"
    assert client.get_run(merge["mlflow_run_id"]).data.tags["upstream_mlflow_run_id"] == sft["mlflow_run_id"]
    assert registered.tags["dagster_run_id"] == outcome["run_id"]
    assert registered.tags["asset_key"] == "tiny/merged_model" and registered.tags["model_dir"] == str(merged / "model")
    assert registered.tags["upstream_mlflow_run_ids"] == sft["mlflow_run_id"]
    # the challenger is the newest version (a retraining in another test may have registered a newer one)
    newest = max(int(v.version) for v in client.search_model_versions("name = 'tiny'"))
    assert alias_version(client, "tiny", CHALLENGER) == str(newest) and newest >= int(version)

    # an MLflow model: logged on the run (its Logged models), with the report's held-out figures attached; a
    # pyfunc that answers prompts
    run = client.get_run(merge["mlflow_run_id"])
    [output] = run.outputs.model_outputs
    logged = client.get_logged_model(output.model_id)
    assert registered.source == f"models:/{logged.model_id}"  # made from the logged model, which lists it
    assert json.loads(logged.tags["mlflow.modelVersions"]) == [{"name": "tiny", "version": int(version)}]
    assert {"heldout/nll", "heldout/perplexity"} <= {m.key for m in logged.metrics or []}
    assert float(registered.tags["heldout/nll"]) == pytest.approx(run.data.metrics["heldout/nll"], rel=1e-5)
    import mlflow.pyfunc

    pyfunc = mlflow.pyfunc.load_model(client.get_model_version_download_uri("tiny", version))
    replies = pyfunc.predict(["Hub Pro blinks red"], params={"max_new_tokens": 4})
    assert len(replies) == 1 and isinstance(replies[0], str)

    # the report's check made it the champion when it passed (later promotions may have moved the alias on)
    [check] = [c for c in outcome["checks"] if c["name"] == "merged_not_worse_than_base"]
    promoted = registered.tags.get("promoted", "")
    assert ("not worse than the base model" in promoted) == check["passed"], (promoted, check)


def test_training_runs_show_their_data_system_metrics_and_the_experiment_kind(materialized):
    client = materialized["tracking"].client()
    experiment = client.get_experiment_by_name("tiny")
    assert experiment.tags["mlflow.experimentKind"] == "finetuning"  # MLflow's model-training view
    sft = runs_of(client, "tiny")["sft_adapter"]
    inputs = {i.tags[0].value: i.dataset for i in sft.inputs.dataset_inputs}
    assert set(inputs) == {"training", "evaluation"}
    dataset_dir = Path(materialized["outcome"]["artifacts"]["sft_dataset"])
    for context, name in (("training", "train.jsonl"), ("evaluation", "eval.jsonl")):
        data = inputs[context]
        assert data.name == "sft_dataset" and json.loads(data.source) == {"uri": str(dataset_dir), "file": name}
        rows = sum(1 for line in (dataset_dir / name).read_text().splitlines() if line.strip())
        assert json.loads(data.profile)["num_rows"] == rows and len(data.digest) == 16
        # MLflow's column spec, which its dataset drawer shows (any other shape reads "Unrecognized Schema Format")
        columns = {c["name"]: c["type"] for c in json.loads(data.schema)["mlflow_colspec"]}
        assert columns["prompt"] == "string" and columns["completion"] == "string"
    assert {
        "system/cpu_utilization_percentage",
        "system/system_memory_usage_megabytes",
        "system/process_rss_megabytes",
    } <= set(sft.data.metrics)


def test_models_uris_name_registered_versions_in_generate_and_chat(chain_copy, monkeypatch):
    materialized = chain_copy  # it promotes by hand (a tag and the champion alias change): on a copy of the stores
    from dragon_dagster import cli
    from dragon_dagster.chat_target import chat_model, deployed

    monkeypatch.setenv("DRAGON_RUNS_DIR", str(materialized["runs"]))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    client = materialized["tracking"].client()
    merged = Path(materialized["outcome"]["artifacts"]["merged_model"])
    version = version_for(client, "tiny", merged)
    newest = client.get_model_version_by_alias("tiny", CHALLENGER)
    assert cli.resolve_target("models:/tiny@challenger") == Path(newest.tags["model_dir"])
    assert cli.resolve_target(f"models:/tiny/{version}") == merged / "model"
    result = CliRunner().invoke(cli.main, ["generate", f"models:/tiny/{version}", "Hello", "--max-new-tokens", "3"])
    assert result.exit_code == 0, result.output
    assert f"model {merged / 'model'}" in result.output
    chosen = chat_model("tiny", f"models:/tiny/{version}")
    assert chosen.spec == {"type": "local", "model": str(merged / "model")}
    assert (chosen.uri, chosen.version) == (f"models:/tiny/{version}", version)  # what its traces name
    # the registry from the command line: versions with aliases, and a rollback by hand
    listed = CliRunner().invoke(cli.main, ["models", "tiny"])
    assert listed.exit_code == 0 and "tiny/merged_model" in listed.output and "challenger" in listed.output
    promoted = CliRunner().invoke(cli.main, ["models", "tiny", "--promote", version])
    assert promoted.exit_code == 0 and f"models:/tiny@champion is now version {version}" in promoted.output
    assert alias_version(client, "tiny", CHAMPION) == version
    live = deployed("tiny")
    assert live.directory == merged / "model" and (live.uri, live.version) == ("models:/tiny@champion", version)
    assert chat_model("tiny").name == f"models:/tiny@champion (version {version})"
    # no alias of that name: one line naming it
    missing = CliRunner().invoke(cli.main, ["generate", "models:/tiny@nobody", "Hello"])
    assert missing.exit_code == 1 and "models:/tiny@nobody" in missing.output and "Traceback" not in missing.output
    with pytest.raises(RegistryError, match="models:/<name>@<alias>"):
        parse_uri("models:/tiny")
    assert parse_uri("runs/x") is None and parse_uri("models:/a/3") == ModelRef("a", version="3")


def test_tracking_uri_follows_mlflow_s_variable_when_the_resource_leaves_it_empty(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert MLflowTracking(runs_dir=str(tmp_path)).uri == f"sqlite:///{tmp_path.resolve() / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:1")
    assert MLflowTracking(runs_dir=str(tmp_path)).uri == "http://127.0.0.1:1"
    assert MLflowTracking(runs_dir=str(tmp_path)).artifact_location("p") is None  # the server decides
    assert MLflowTracking(runs_dir=str(tmp_path), tracking_uri="sqlite:///x.db").uri == "sqlite:///x.db"


@pytest.mark.slow  # a server start and a tiny chain: about 100 s on 2 cores
def test_a_stage_tracks_and_registers_on_a_real_mlflow_server(
    mlflow_server, tiny_model, tmp_path, monkeypatch, resources_for
):
    """MLFLOW_TRACKING_URI alone points the pipeline at the server: runs, metrics, datasets and the registered
    model (uploaded through the server's artifact proxy) are there, and a models:/ URI downloads the model."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server["url"])
    monkeypatch.setenv("DRAGON_SYSTEM_METRICS_INTERVAL_S", "1")
    pipeline = load(write_pipeline(tmp_path / "defs", tiny_model))
    resources = resources_for(tmp_path / "runs")  # tracking_uri empty: the variable decides
    assert resources["tracking"].uri == mlflow_server["url"]
    (tmp_path / "home").mkdir()
    parts = build_pipeline_defs(pipeline)
    result = materialize(
        parts["assets"],
        resources=resources,
        instance=DagsterInstance.local_temp(str(tmp_path / "home")),
        selection=AssetSelection.assets(
            *[["tiny", n] for n in ("tickets", "sft_dataset", "sft_adapter", "merged_model")]
        ),
    )
    assert result.success
    assert not (tmp_path / "runs" / "mlflow.db").exists(), "nothing went to the local sqlite store"

    from mlflow import MlflowClient

    client = MlflowClient(mlflow_server["url"])  # what anyone with the URL sees
    sft = runs_of(client, "tiny")["sft_adapter"]
    assert sft.info.status == "FINISHED" and "train/loss" in client.get_run(sft.info.run_id).data.metrics
    assert len(client.get_metric_history(sft.info.run_id, "system/cpu_utilization_percentage")) >= 1
    assert {i.dataset.name for i in sft.inputs.dataset_inputs} == {"sft_dataset"}
    version = client.get_model_version_by_alias("tiny", "challenger")
    merge = runs_of(client, "tiny")["merged_model"]  # the merge's run logged it, nested like the stage's
    assert version.run_id == merge.info.run_id and merge.data.tags["upstream_mlflow_run_id"] == sft.info.run_id
    assert merge.data.tags["mlflow.parentRunId"] == sft.data.tags["mlflow.parentRunId"]
    stored = list((mlflow_server["root"] / "artifacts").rglob("model.safetensors"))
    assert stored, "the model files were uploaded to the server's artifact store"

    # another machine: the artifact directory is not there, so the model comes from the server, once
    client.delete_model_version_tag("tiny", version.version, "model_dir")
    cache = tmp_path / "cache"
    local = model_dir(client, ModelRef("tiny", alias="challenger"), cache)
    assert local.parent.parent.parent == cache / "tiny" and local.parent.parent.name.startswith(f"{version.version}-")
    assert (local / "config.json").exists() and (local / "tokenizer_config.json").exists()
    assert model_dir(client, ModelRef("tiny", version=version.version), cache) == local  # cached


def test_dragon_export_writes_gguf_and_a_modelfile_for_a_registered_model(materialized, monkeypatch, tmp_path):
    from dragon_dagster import cli

    monkeypatch.setenv("DRAGON_RUNS_DIR", str(materialized["runs"]))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    out = tmp_path / "export"
    result = CliRunner().invoke(
        cli.main, ["export", "models:/tiny@challenger", "--ollama", "--out", str(out), "--system", "Be brief."]
    )
    assert result.exit_code == 0, result.output
    files = sorted(p.name for p in out.iterdir())
    assert files == ["Modelfile", "README.md", "tiny-f16.gguf", "tiny-q8_0.gguf"]
    assert result.output.strip().splitlines()[-1] == f"ollama create tiny -f {out / 'Modelfile'}"
    modelfile = (out / "Modelfile").read_text()
    assert "FROM ./tiny-q8_0.gguf" in modelfile and "Be brief." in modelfile
    card = (out / "README.md").read_text()
    # the champion may be the pipeline's merged model or a retraining's (another test may have promoted one)
    stages = ("sft_adapter", "sft_on_feedback", "dpo_on_feedback", "kto_on_feedback")
    assert any(stage in card for stage in stages), "the card names the stages it was trained with"


def test_the_pipeline_report_promotes_over_its_own_merges_but_keeps_a_retrained_champion(tmp_path, tiny_model):
    from dagster import AssetKey, AssetMaterialization, MetadataValue, build_asset_check_context

    from dragon_dagster.assets.checks import asset_checks
    from dragon_dagster.engine import catalog
    from dragon_dagster.engine.artifacts.manifest import ReportManifest, write_manifest
    from dragon_dagster.engine.stages.evaluate.result import ReportResult
    from dragon_dagster.engine.stages.evaluate.settings import Evaluate

    tracking = MLflowTracking(runs_dir=str(tmp_path / "runs"))
    instance = DagsterInstance.ephemeral()
    key = AssetKey(["tiny", "evaluation_report"])
    stage = Evaluate(name="evaluation_report", kind="evaluate", dataset="sft_dataset")
    [check] = asset_checks(key, catalog.get("evaluate").checks(stage))

    def merged(stage: str, name: str, asset: str) -> Path:
        directory = tmp_path / stage / name
        directory.mkdir(parents=True)
        tracking.register_model("tiny", tiny_model, None, {"artifact_dir": str(directory), "asset_key": asset})
        return directory

    def report_on(directory: Path):
        report_dir = tmp_path / f"report-{directory.name}"
        report_dir.mkdir()
        figures = {"eval_loss": 1.0, "metrics": {}}
        report = ReportResult(task="chat", held_out=True, rows=4, merged_not_worse=True, base=figures, merged=figures)
        (report_dir / "report.json").write_text(report.model_dump_json())
        write_manifest(report_dir, ReportManifest(merged=str(directory), dataset="sft_dataset", settings={}))
        instance.report_runless_asset_event(
            AssetMaterialization(key, metadata={"artifact_dir": MetadataValue.path(str(report_dir))})
        )
        return check(build_asset_check_context(instance=instance, resources={"tracking": tracking}))

    client = tracking.client()
    first = report_on(merged("merged_model", "m1", "tiny/merged_model"))
    assert first.passed and alias_version(client, "tiny", CHAMPION) == "1"  # the first champion
    assert report_on(merged("merged_model", "m2", "tiny/merged_model")).passed
    assert alias_version(client, "tiny", CHAMPION) == "2"  # a newer pipeline model replaces an older one
    retrained = merged("retrained_model", "r1", "tiny/retrained_model")
    tracking.promote("tiny", "3", "promotion_gate passed")
    kept = report_on(merged("merged_model", "m3", "tiny/merged_model"))
    assert kept.passed and alias_version(client, "tiny", CHAMPION) == "3", "a retrained champion stays"
    assert alias_version(client, "tiny", CHALLENGER) == "4"
    assert kept.metadata["to_promote"].value == "dragon models tiny --promote 4"
    assert retrained.exists()


def test_a_registry_that_does_not_answer_is_an_error_not_no_champion(tmp_path, monkeypatch):
    """A tracking server down must not make chat or retraining fall back to another model silently."""
    from dragon_dagster import cli

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "3")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    monkeypatch.setenv("DRAGON_RUNS_DIR", str(tmp_path / "runs"))
    down = "MLflow's tracking server on 127.0.0.1:"
    with pytest.raises(RegistryError, match=down):
        MLflowTracking(runs_dir=str(tmp_path / "runs")).champion_dir("tiny")
    result = CliRunner().invoke(cli.main, ["generate", "models:/tiny@champion", "Hi"])
    assert result.exit_code == 1 and down in result.output and "Traceback" not in result.output
    assert "Connection refused. Fix: start the MLflow tracking server" in result.output
