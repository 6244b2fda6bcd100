"""The promotion gate's figures on held-out feedback: which replies and pairs are measured, the arithmetic of
reward, pair accuracy and liked share, a real model's figures with a taste, and the gate's decision."""

import json

import pytest

from dragon_dagster.assets.promotion_gate import gain_decision
from dragon_dagster.engine.evaluate.feedback_gain import gain, held_out_feedback, model_figures
from dragon_dagster.engine.pipeline import PipelineError, parse
from dragon_dagster.engine.pipeline.retraining import Gate

Q1, Q2 = [{"role": "user", "content": "Hub Pro blinks red"}], [{"role": "user", "content": "Doorbell lags"}]


def reply(text):
    return [{"role": "assistant", "content": text}]


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_held_out_feedback_gathers_rated_replies_and_pairs(tmp_path):
    files = {
        "sft": write(tmp_path / "sft.jsonl", [{"prompt": Q1, "completion": reply("Check the cable.")}]),
        "dpo": write(
            tmp_path / "dpo.jsonl",
            [{"prompt": Q1, "chosen": reply("Check the cable."), "rejected": reply("It is fine.")}],
        ),
        "kto": write(tmp_path / "kto.jsonl", [{"prompt": Q2, "completion": reply("Whatever."), "label": False}]),
        "none": None,
    }
    rated, pairs = held_out_feedback(files)
    assert [(r["completion"][0]["content"], r["label"]) for r in rated] == [
        ("Check the cable.", True),
        ("It is fine.", False),
        ("Whatever.", False),
    ]  # the liked reply counted once
    assert len(pairs) == 1


def test_gain_arithmetic():
    rated = [
        {"prompt": Q1, "completion": reply("a"), "label": True},
        {"prompt": Q2, "completion": reply("b"), "label": False},
    ]
    start = {"logps": [-2.0, -1.0], "pair_wins": [False, True], "taste_scores": [0.0, 1.0]}
    retrained = {"logps": [-1.5, -1.5], "pair_wins": [True, True], "taste_scores": [1.0, 1.0]}
    figures = gain(start, retrained, rated, [{}, {}])
    # liked reply up by 0.5, disliked down by 0.5: both the right way
    assert figures["reward"] == {"start": 0.0, "retrained": 0.5, "gain": 0.5, "right_way": 1.0}
    assert figures["pair_accuracy"] == {"start": 0.5, "retrained": 1.0, "gain": 0.5}
    assert figures["liked_share"] == {"start": 0.5, "retrained": 1.0, "gain": 0.5, "liked_at": 1.0}
    assert figures["held_out"] == {"rated_replies": 2, "liked": 1, "disliked": 1, "pairs": 2, "prompts": 2}
    backwards = gain(retrained, start, rated, [])
    assert backwards["reward"]["gain"] == -0.5 and backwards["pair_accuracy"] is None


def test_a_real_model_s_figures_with_a_taste(tiny_model, tmp_path):
    from dragon_dagster.engine.config.hardware import Hardware
    from dragon_dagster.engine.models import load_model, load_tokenizer
    from dragon_dagster.engine.rewards import RewardSet

    (tmp_path / "taste.py").write_text(
        "def reward(prompt, completion, reference, row):\n    return 1.0 if len(completion.split()) < 60 else 0.0\n"
    )
    taste = RewardSet.from_list([{"type": "custom", "file": "taste.py"}], base_dir=tmp_path)
    rated = [
        {"prompt": Q1, "completion": reply("Check the cable."), "label": True},
        {"prompt": Q1, "completion": reply("It is fine."), "label": False},
        {"prompt": Q2, "completion": reply("Whatever."), "label": False},
    ]
    pairs = [{"prompt": Q1, "chosen": reply("Check the cable."), "rejected": reply("It is fine.")}]
    model = load_model(str(tiny_model), Hardware(device="cpu"))
    raw = model_figures(model, load_tokenizer(str(tiny_model)), rated, pairs, taste, max_new_tokens=4)
    assert len(raw["logps"]) == 3 and all(lp < 0 for lp in raw["logps"])
    assert raw["pair_wins"] == [raw["logps"][0] > raw["logps"][1]]  # the pair is rated rows 0 and 1
    assert raw["taste_scores"] == [1.0, 1.0], "two distinct prompts, 4-token replies: under 60 words"
    same = gain(raw, raw, rated, pairs)
    assert same["reward"]["gain"] == 0.0 and same["pair_accuracy"]["gain"] == 0.0


def test_gate_decisions_name_the_deciding_figure():
    measured = {
        "held_out": {"rated_replies": 4},
        "reward": {"start": 0.0, "retrained": 0.02, "gain": 0.02},
        "pair_accuracy": None,
    }
    assert gain_decision(measured, Gate())[0] == []
    short, figures = gain_decision(measured, Gate(min_gain=0.05))
    assert short == ["reward gain 0.02 is not above min_gain 0.05 on the held-out feedback"]
    assert figures["feedback/reward_gain"] == 0.02 and figures["min_gain"] == 0.05
    [why], _ = gain_decision(measured, Gate(metric="pair_accuracy"))
    assert why.startswith("no held-out feedback to measure pair_accuracy on")
    assert gain_decision(measured, Gate(metric="pair_accuracy", min_gain=None))[0] == []  # "not worse" alone
    with pytest.raises(ValueError, match="liked_share needs `taste`"):
        Gate(metric="liked_share")
    # min_gain: null promotes on "not worse": a measured fall of the feedback figure still refuses
    fell = {**measured, "reward": {"start": 0.0, "retrained": -0.01, "gain": -0.01}}
    assert gain_decision(fell, Gate(min_gain=None))[0] == ["reward fell by 0.01 on the held-out feedback"]
    with pytest.raises(ValueError, match="exact compares with a reference answer"):
        Gate(taste=[{"type": "exact"}])
    with pytest.raises(ValueError, match="held_out_frac is 0"):
        Gate(held_out_frac=0)
    with pytest.raises(ValueError, match=r"unknown metric\(s\) \['tokenf1'\]"):
        Gate(task_tolerance={"tokenf1": 0.1})
    tolerance = Gate(task_tolerance={"token_f1": 0.05}).task_tolerance  # given values replace defaults one by one
    assert tolerance["token_f1"] == 0.05 and tolerance["eval_loss"] == 0.02 and tolerance["exact"] == 0.0
    stages = [
        {"name": "d", "kind": "chat_dataset", "path": "x.csv", "prompt": "p", "response": "r"},
        {"name": "s", "kind": "sft", "dataset": "d"},
        {"name": "m", "kind": "merge"},
    ]
    with pytest.raises(PipelineError, match=r"feedback.gate: .*gate.taste\[0\]: unknown reward type 'vibes'"):
        parse({"name": "p", "stages": stages, "feedback": {"gate": {"taste": [{"type": "vibes"}]}}})


def test_a_missing_taste_file_fails_the_retraining_before_it_trains(tmp_path):
    from dagster import Failure

    from dragon_dagster.assets.feedback_taste import taste_rewards

    stages = [
        {"name": "d", "kind": "chat_dataset", "path": "x.csv", "prompt": "p", "response": "r"},
        {"name": "s", "kind": "sft", "dataset": "d"},
        {"name": "m", "kind": "merge"},
    ]
    pipeline = parse(
        {
            "name": "p",
            "stages": stages,
            "feedback": {"gate": {"metric": "liked_share", "taste": [{"type": "custom", "file": "taste.py"}]}},
        },
        tmp_path / "p.yaml",
    )
    with pytest.raises(Failure, match=r"p feedback.gate.taste: .*taste.py' does not exist"):
        taste_rewards(pipeline)
    (tmp_path / "taste.py").write_text("def reward(prompt, completion, reference, row):\n    return 1.0\n")
    assert len(taste_rewards(pipeline)) == 1
