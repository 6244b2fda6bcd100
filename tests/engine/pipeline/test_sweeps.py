"""Sweeps in the pipeline's YAML: their points, and every mistake named (stage, setting, value, method)."""

import re

import pytest

from dragon_dagster.engine.pipeline import PipelineError, load
from dragon_dagster.engine.pipeline.sweeps import Sweep, best_point, nested
from tests.engine.pipeline.test_definition import EVERY_KIND, write

PROFILE = "profiles:\n  quick:\n    sft: {args: {max_steps: 3}, n_samples: 1}\n"


def with_sweep(body: str) -> str:
    return EVERY_KIND + PROFILE + "sweeps:\n  lr:\n" + "".join(f"    {line}\n" for line in body.splitlines())


GRID = """\
metric: eval/loss
profile: quick
over:
  sft.args.learning_rate: [1.0e-4, 2e-4]
  sft.lora.r: [8, 16]
  dpo.beta: [0.1, 0.3]"""


def test_a_grid_is_every_combination_over_its_profile(tmp_path):
    pipeline = load(write(tmp_path, with_sweep(GRID)))
    sweep = pipeline.sweep("lr")
    points = sweep.settings()
    assert len(points) == 8 and len({tuple(p.items()) for p in points}) == 8
    assert points[0] == {"sft.args.learning_rate": 1e-4, "sft.lora.r": 8, "dpo.beta": 0.1}
    assert all(isinstance(p["sft.args.learning_rate"], float) for p in points)  # YAML 1.1's '2e-4' read as a number
    assert pipeline.sweep_overrides("lr", points[-1]) == {
        "sft": {"args": {"max_steps": 3, "learning_rate": 2e-4}, "n_samples": 1, "lora": {"r": 16}},
        "dpo": {"beta": 0.3},
    }
    assert pipeline.sweep_stage("lr") == "report"


def test_random_draws_distinct_points_the_same_for_the_same_seed(tmp_path):
    body = GRID.replace("metric:", "method: random\npoints: 3\nseed: 7\nmetric:")
    first = load(write(tmp_path, with_sweep(body))).sweep("lr").settings()
    again = load(write(tmp_path, with_sweep(body))).sweep("lr").settings()
    other = load(write(tmp_path, with_sweep(body.replace("seed: 7", "seed: 8")))).sweep("lr").settings()
    assert first == again and len(first) == 3 and len({tuple(p.items()) for p in first}) == 3
    assert other != first


@pytest.mark.parametrize(
    "replace, message",
    [
        ("sft.lora.r: [8, 16]", "sweep 'lr': 'sfx.lora.r' names 'sfx', which is not a stage"),
        ("sft.lora.r: [8, 16]", "sweep 'lr': 'sft.lora.rank': 'rank' is unknown in lora"),
        ("sft.lora.r: [8, 16]", "sweep 'lr': 'sft.dataset': 'dataset' is not a per-run setting in the stage"),
        ("sft.lora.r: [8, 16]", "sweeps.lr.over: Value error, 'sft.lora.r' has an empty list of values"),
        ("sft.lora.r: [8, 16]", "sweep 'lr', sft.lora.r=0, stage 'sft': lora.r: Input should be greater than 0"),
        ("sft.lora.r: [8, 16]", "sweeps.lr.over: Value error, 'sft' is not <stage>.<setting>"),
        ("metric: eval/loss", "sweeps.lr.method: Input should be 'grid' or 'random' (got 'bayes')"),
        ("metric: eval/loss", "sweeps.lr: Value error, method random needs `points`"),
        ("metric: eval/loss", "sweeps.lr: Value error, points 9 is more than the 8 distinct combinations"),
        ("metric: eval/loss", "sweeps.lr.goal: Input should be 'minimize' or 'maximize'"),
        ("profile: quick", "sweep 'lr' names profile 'slow'; the profiles are ['quick']"),
        ("profile: quick", "sweep 'lr' ranks by stage 'sft', which is not an evaluate stage: ['report']"),
    ],
)
def test_a_wrong_sweep_is_named(tmp_path, replace, message):
    bad = {
        "sweep 'lr': 'sfx.lora.r'": "sfx.lora.r: [8, 16]",
        "'rank' is unknown": "sft.lora.rank: [8, 16]",
        "'dataset' is not a per-run": "sft.dataset: [chat]",
        "empty list": "sft.lora.r: []",
        "greater than 0": "sft.lora.r: [8, 0]",
        "is not <stage>": "sft: [1]",
        "'bayes'": "method: bayes\nmetric: eval/loss",
        "needs `points`": "method: random\nmetric: eval/loss",
        "points 9": "method: random\npoints: 9\nmetric: eval/loss",
        "'maximize'": "goal: best\nmetric: eval/loss",
        "profile 'slow'": "profile: slow",
        "ranks by stage 'sft'": "profile: quick\nstage: sft",
    }
    [text] = [v for k, v in bad.items() if k in message]
    with pytest.raises(PipelineError) as raised:
        load(write(tmp_path, with_sweep(GRID.replace(replace, text))))
    assert message in re.sub(r" \(line \d+\)", "", str(raised.value))  # the YAML's line is named too


def test_a_grid_takes_no_points_and_an_unknown_sweep_is_named(tmp_path):
    with pytest.raises(PipelineError, match=r"`points` is for method random; a grid runs every combination \(8\)"):
        load(write(tmp_path, with_sweep(GRID + "\npoints: 2")))
    pipeline = load(write(tmp_path, with_sweep(GRID)))
    with pytest.raises(PipelineError, match=r"pipeline 'every' has no sweep 'rl'; it has \['lr'\]"):
        pipeline.sweep("rl")


def test_points_nest_as_overrides_and_the_best_follows_the_goal():
    assert nested({"a.args.lr": 1, "a.lora.r": 8, "b.beta": 0.1}) == {
        "a": {"args": {"lr": 1}, "lora": {"r": 8}},
        "b": {"beta": 0.1},
    }
    rows = [{"point": 0, "metric": 2.0}, {"point": 1, "metric": None}, {"point": 2, "metric": 1.5}]
    assert best_point(rows, "minimize")["point"] == 2
    assert best_point(rows, "maximize")["point"] == 0
    assert best_point([{"point": 0, "metric": float("nan")}], "minimize") is None
    assert Sweep(over={"a.b": [1, 2]}).settings() == [{"a.b": 1}, {"a.b": 2}]
