"""The pipeline's JSON schema, as `dg check yaml` and editors use it: a stage is checked against its own kind's
model and a reward against its own type's, so a typo names the field, on the stages and rewards of today's kinds."""

import jsonschema
import yaml

from dragon_dagster.engine.pipeline import Pipeline
from dragon_dagster.engine.pipeline.definition import EXAMPLE_DIR

BUNDLED = EXAMPLE_DIR.parent / "defs" / "support" / "defs.yaml"


def errors(attributes: dict) -> list[str]:
    validator = jsonschema.Draft202012Validator(Pipeline.model_json_schema())
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(attributes)]


def bundled() -> dict:
    return yaml.safe_load(BUNDLED.read_text())["attributes"]


def test_the_bundled_pipeline_validates():
    assert errors(bundled()) == []


def test_a_misspelled_reward_option_is_named_with_its_place():
    attributes = bundled()
    grpo = next(s for s in attributes["stages"] if s["kind"] == "grpo")
    grpo["rewards"][1] = {"type": "length", "max_chars": 16, "patern": "x"}
    found = errors(attributes)
    assert any(e.startswith("stages.5.rewards.1:") and "'patern' was unexpected" in e for e in found), found


def test_a_misspelled_stage_setting_and_an_unknown_kind_are_named():
    attributes = bundled()
    attributes["stages"][1]["args"]["grad_acum"] = 1
    attributes["stages"][3]["kind"] = "dpoo"
    found = errors(attributes)
    assert any(e.startswith("stages.1.args:") and "'grad_acum' was unexpected" in e for e in found), found
    assert any(e.startswith("stages.3.kind:") and "'dpoo' is not one of" in e for e in found), found


def test_numbers_written_as_yaml_1_1_text_validate():
    attributes = bundled()
    attributes["stages"][1]["args"]["learning_rate"] = "2e-4"  # what PyYAML makes of `2e-4`
    assert errors(attributes) == []
