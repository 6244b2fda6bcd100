"""Whether a stage helped: paired per-row NLLs, the Wilcoxon signed-rank test, a verdict in words."""

import math

from dragon_dagster.engine.evaluate.stage_change import paired_change, stage_changes

BEFORE = [2.0, 1.5, 3.0, 2.2, 1.8, 2.6, 2.9, 1.1, 2.4, 2.0, 1.7, 2.8]


def test_a_consistent_drop_is_better_and_a_rise_worse():
    better = paired_change(BEFORE, [b - 0.3 - 0.01 * i for i, b in enumerate(BEFORE)])
    assert better["verdict"] == "better" and better["p_value"] < 0.01 and better["rows"] == 12
    assert math.isclose(better["mean_difference"], better["mean_after"] - better["mean_before"])
    worse = paired_change(BEFORE, [b + 0.2 + 0.01 * i for i, b in enumerate(BEFORE)])
    assert worse["verdict"] == "worse" and worse["mean_difference"] > 0


def test_a_measured_change_of_under_one_percent_is_said_to_be_small():
    tiny = paired_change(BEFORE, [b - 0.004 - 0.0001 * i for i, b in enumerate(BEFORE)])  # every row, by a hair
    assert tiny["p_value"] < 0.01 and tiny["verdict"] == "better, by under 1%"


def test_noise_and_no_change_are_no_measurable_change():
    noisy = paired_change(BEFORE, [b + (0.1 if i % 2 else -0.1) for i, b in enumerate(BEFORE)])
    assert noisy["verdict"] == "no measurable change" and noisy["p_value"] > 0.5
    same = paired_change(BEFORE, BEFORE)
    assert same == {**same, "verdict": "no measurable change", "p_value": 1.0, "mean_difference": 0.0}
    few = paired_change([2.0, 2.0], [1.0, 1.0])  # two rows cannot show a change at 0.05, however large
    assert few["verdict"] == "no measurable change"
    # the same weights scored another way: every row a rounding error higher, which the test alone would call worse
    rounded = paired_change(BEFORE, [b + 5e-8 * (1 + i) for i, b in enumerate(BEFORE)])
    assert rounded["verdict"] == "no measurable change" and rounded["p_value"] == 1.0


def test_rows_without_a_reply_are_left_out_and_none_left_is_said():
    nan = float("nan")
    assert paired_change([nan, *BEFORE], [1.0, *BEFORE])["rows"] == 12
    empty = paired_change([nan], [nan])
    assert empty["rows"] == 0 and empty["p_value"] is None and empty["verdict"].startswith("not measured")


def test_each_stage_is_compared_with_the_model_before_it():
    models = [
        {"model": "base", "row_nll": BEFORE},
        {"model": "after sft", "stage": "sft", "row_nll": [b - 0.5 for b in BEFORE]},
        {"model": "after grpo", "stage": "grpo", "row_nll": [b - 0.5 for b in BEFORE]},
    ]
    changes = stage_changes(models)
    assert [(c["stage"], c["against"], c["verdict"]) for c in changes] == [
        ("sft", "base", "better"),
        ("grpo", "after sft", "no measurable change"),
    ]
