"""A sweep's points read typed: each point's stages as their settings models with the point's values in (the
sweep's profile under them), a setting found by its path of fields."""

import yaml

from dragon_dagster.assets.sweep import sweep_points
from dragon_dagster.engine.pipeline import parse

PIPELINE = """\
name: tiny
model: tiny
datasets:
  tickets: {path: tickets.csv}
stages:
  - {name: sft_dataset, kind: chat_dataset, source: tickets, prompt: "{subject}", response: reply}
  - {name: sft_adapter, kind: sft, dataset: sft_dataset, args: {max_steps: 4, learning_rate: 2e-4}}
  - {name: merged_model, kind: merge}
  - {name: evaluation_report, kind: evaluate, dataset: sft_dataset}
profiles:
  quick: {sft_adapter: {args: {max_steps: 3}}}
sweeps:
  lr:
    over:
      sft_adapter.args.learning_rate: [1.0e-5, 3e-3]
      sft_adapter.lora.r: [4]
    profile: quick
"""


def test_each_point_holds_its_stages_typed_with_the_point_and_the_profile_in():
    pipeline = parse(yaml.safe_load(PIPELINE))
    first, second = sweep_points(pipeline, "lr", "x")
    assert second.value("sft_adapter.args.learning_rate") == 3e-3  # written 3e-3: YAML 1.1 text, read as a number
    assert isinstance(second.value("sft_adapter.args.learning_rate"), float)
    assert first.value("sft_adapter.args.max_steps") == 3  # the profile's, under the point
    assert first.value("sft_adapter.lora.r") == 4 and first.value("sft_adapter.lora.alpha") == 32  # kind's default
    assert first.stages["sft_dataset"] == pipeline.stage("sft_dataset")  # a stage the point leaves alone
    assert pipeline.stage("sft_adapter").args.learning_rate == 2e-4  # the pipeline's own settings untouched
