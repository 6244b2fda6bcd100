"""Each profile is a job of its own whose launchpad starts from the profile's values (issue 26: the launchpad
showed the full profile's values after the demo ran `quick`), and whose runs say which profile they used."""

from pathlib import Path

from dagster import Definitions, validate_run_config

from dragon_dagster.assets.factory import build_pipeline_defs
from dragon_dagster.engine.pipeline import load
from dragon_dagster.resources import default_resources

SUPPORT = Path(__file__).parents[2] / "dragon_dagster" / "defs" / "support" / "defs.yaml"


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
