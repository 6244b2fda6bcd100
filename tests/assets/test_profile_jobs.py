"""Each profile is a job of its own whose launchpad starts from the profile's values (issue 26: the launchpad
showed the full profile's values after the demo ran `quick`), and whose runs say which profile they used."""

import textwrap
from pathlib import Path

import pandas as pd
from dagster import DagsterInstance, Definitions, validate_run_config

from dragon_dagster.assets.factory import build_pipeline_defs
from dragon_dagster.assets.launch import materialize_pipeline
from dragon_dagster.assets.status import stage_states
from dragon_dagster.engine.pipeline import load
from dragon_dagster.resources import default_resources

SUPPORT = Path(__file__).parents[2] / "dragon_dagster" / "defs" / "support" / "defs.yaml"
EXAMPLES = Path(__file__).parents[2] / "dragon_dagster" / "example_data"


def test_each_profile_is_a_job_whose_launchpad_starts_from_its_values():
    pipeline = load(SUPPORT)
    defs = Definitions(**build_pipeline_defs(pipeline), resources=default_resources())
    quick, full = defs.resolve_job_def("support_quick"), defs.resolve_job_def("support_pipeline")
    assert quick.tags["dragon/profile"] == "quick" and "dragon/profile" not in full.tags
    assert set(quick.asset_layer.executable_asset_keys) == set(full.asset_layer.executable_asset_keys)
    effective = validate_run_config(quick, quick.run_config)["ops"]  # the launchpad's defaults, as Dagster reads them
    for stage, overrides in pipeline.profile("quick").items():
        config = effective[f"support__{stage}"]["config"]
        for name, value in overrides.items():
            if isinstance(value, dict):
                assert {k: config[name][k] for k in value} == value, (stage, name)
            else:
                assert config[name] == value, (stage, name)
    assert effective["support__sft_adapter"]["config"]["args"]["max_steps"] == 24  # quick's, not the YAML's epochs


def test_a_profile_s_run_is_listed_under_its_job_and_its_mlflow_run_has_the_profile_s_settings(
    tiny_model, tmp_path, resources_for
):
    """Issue 58: after `dragon demo` (the quick profile) the launchpad of the job its run is listed under opens on
    what it ran; the pipeline's MLflow run has the stage's settings as the profile made them, and the stage's
    version Dagster shows."""
    folder = tmp_path / "p"
    folder.mkdir()
    pd.read_csv(EXAMPLES / "tickets.csv").head(20).to_csv(folder / "tickets.csv", index=False)
    (folder / "defs.yaml").write_text(
        textwrap.dedent(f"""\
        name: small
        model: {tiny_model}
        datasets:
          tickets: {{path: tickets.csv}}
        stages:
          - {{name: sft_dataset, kind: chat_dataset, source: tickets, prompt: subject, response: reply, eval_frac: 0.1}}
        profiles:
          quick:
            sft_dataset: {{eval_frac: 0.25}}
        """)
    )
    pipeline, instance, resources = load(folder / "defs.yaml"), DagsterInstance.ephemeral(), resources_for(tmp_path)
    outcome = materialize_pipeline(pipeline, "quick", resources=resources, instance=instance)
    assert outcome["success"]
    run = instance.get_run_by_id(outcome["run_id"])
    parts = build_pipeline_defs(pipeline)
    job = Definitions(**parts, resources=resources).resolve_job_def(run.job_name)
    assert run.job_name == "small_quick" and run.tags["dragon/profile"] == "quick"
    assert validate_run_config(job, job.run_config)["ops"]["small__sft_dataset"]["config"]["eval_frac"] == 0.25

    tracking = resources["tracking"]
    query = f"tags.dagster_run_id = '{run.run_id}' and tags.level = 'pipeline'"
    [parent] = tracking.client().search_runs([tracking.experiment_id("small")], query)
    assert parent.info.run_name == f"small_quick {run.run_id[:8]}"
    assert parent.data.params["sft_dataset.eval_frac"] == "0.25" and parent.data.params["profile"] == "quick"
    [state] = [s for s in stage_states(pipeline, parts["assets"], instance) if s.name == "sft_dataset"]
    assert parent.data.tags["version.sft_dataset"] == state.code_version  # `dragon status`'s, not the profile's
