import math

import pytest
from pydantic import ValidationError

from dragon_dagster.engine.config.hardware import Hardware, SettingsError, build
from dragon_dagster.engine.config.training import Lora, TrainArgs
from dragon_dagster.engine.evaluate import metrics
from dragon_dagster.engine.text import matchers


def test_task_metrics_follow_dragon_metrics():
    assert matchers.exact("  The answer is Paris. ", "the answer is paris") == 1.0
    assert matchers.exact("Paris", "Lyon") == 0.0
    assert matchers.contains("I think it is Paris!", "paris") == 1.0
    assert matchers.contains("anything", "") == 0.0
    assert matchers.token_f1("the cat sat", "the cat sat") == 1.0
    assert math.isclose(matchers.token_f1("the cat", "the cat sat down"), 2 * (1 * 0.5) / 1.5)
    assert matchers.json_valid('```json\n{"a": 1}\n```') == 1.0
    assert matchers.json_valid("{a: 1}") == 0.0
    assert matchers.numeric("so it is 1,000", "1000") == 1.0
    assert matchers.numeric("half: 1/2", "0.5") == 1.0
    assert matchers.numeric("12 then 13", "12") == 0.0
    assert matchers.numeric("no number", "3") == 0.0
    assert matchers.length_ratio("abcd", "ab") == 2.0
    assert metrics.metric_regex(r"^T-\d{4}")("t-1234 done") == 1.0
    scored = metrics.score(["4", "five"], ["4", "5"], names=["exact", "numeric"])
    assert scored == {"exact": 0.5, "numeric": 0.5}
    with pytest.raises(ValueError, match="unknown metric"):
        metrics.score(["a"], ["a"], names=["bleu"])


@pytest.mark.parametrize(
    "cls,values,field",
    [
        (TrainArgs, {"learning_rate": -1e-4}, "learning_rate"),
        (TrainArgs, {"batch_size": 0}, "batch_size"),
        (TrainArgs, {"warmup_ratio": 1.5}, "warmup_ratio"),
        (TrainArgs, {"max_steps": -3}, "max_steps"),
        (TrainArgs, {"learning_rate": float("nan")}, "learning_rate"),
        (Lora, {"r": 0}, "r"),
        (Lora, {"dropout": 1.0}, "dropout"),
    ],
)
def test_out_of_range_stage_settings_name_the_field(cls, values, field):
    with pytest.raises(ValidationError) as raised:
        cls(**values)
    assert [e["loc"] for e in raised.value.errors()] == [(field,)]


@pytest.mark.parametrize(
    "values,field", [({"device": "tpu"}, "hardware.device"), ({"dtype": "int8"}, "hardware.dtype")]
)
def test_out_of_range_hardware_names_the_field(values, field):
    with pytest.raises(SettingsError, match=field):
        build(Hardware, values, "hardware")


def test_unknown_settings_are_named_not_ignored():
    with pytest.raises(ValidationError, match="learning_rat"):
        TrainArgs(learning_rat=1e-4)
    with pytest.raises(SettingsError, match="devise"):
        build(Hardware, {"devise": "cpu"}, "hardware")
    assert TrainArgs(epochs=1).learning_rate == 2e-4  # dragon_train_args defaults
