"""The adaptive KL controller (train/reinforce/kl_control.py): the coefficient rises while the KL is over its target
and falls while under, by the clipped proportional rule; in a training run it sets the trainer's beta after each
logged step and the progress file shows it."""

import json

import pytest

from dragon_dagster.engine.train.reinforce.kl_control import AdaptiveKL


def test_the_coefficient_follows_the_kl_against_its_target():
    controller = AdaptiveKL(value=0.1, target=0.05, horizon=100)
    # KL twice the target: the error clips at +0.2, so 10 completions move beta by 1 + 0.2 * 10 / 100
    assert controller.update(0.10, 10) == pytest.approx(0.1 * 1.02)
    assert controller.update(0.055, 10) == pytest.approx(0.1 * 1.02 * 1.01)  # 10% over: +1%
    held = controller.value
    assert controller.update(0.05, 10) == pytest.approx(held)  # on target: unchanged
    assert controller.update(0.0, 10) == pytest.approx(held * 0.98)  # under: clipped at -0.2, falls
    values = [controller.update(kl, 16) for kl in (0.2, 0.2, 0.2)]
    assert values == sorted(values) and values[-1] > held  # over target step after step: rises each time


def test_a_stage_moves_beta_to_its_kl_target_and_measures_pass_at_k(tiny_model, tmp_path):
    from dragon_dagster.engine import catalog
    from dragon_dagster.engine.config.hardware import Hardware
    from dragon_dagster.engine.config.job import TrainingInputs
    from dragon_dagster.engine.config.reporter import Reporter
    from dragon_dagster.engine.data import tables as data
    from dragon_dagster.engine.pipeline.definition import EXAMPLE_DIR
    from dragon_dagster.engine.train.reinforce.kl_control import CLIP

    prompts = data.map_prompts(
        data.read_table(EXAMPLE_DIR / "arithmetic.csv"), data.PromptsMapping(prompt="question", reference="answer")
    )[:12]
    data.write_jsonl(tmp_path / "prompts.jsonl", prompts)
    (tmp_path / "out").mkdir()
    settings = catalog.parse_stage(
        {
            "name": "rloo_adapter",
            "kind": "rloo",
            "dataset": "prompts",
            "args": {
                "max_steps": 3,
                "batch_size": 2,
                "grad_accum": 1,
                "logging_steps": 1,
                "save_steps": 100,
                "learning_rate": 5e-2,
                "warmup_ratio": 0.0,
            },
            "rewards": [{"type": "length", "max_chars": 24}, {"type": "numeric", "weight": 0.5}],
            "pass_samples": 4,  # pass@k, measured in the same run
            "pass_k": 2,
            "group_size": 4,
            "beta": 0.05,
            "kl_target": 1e-6,  # far below what an update reaches: beta rises after one, falls after a step at 0
            "kl_horizon": 16,
            "max_new_tokens": 6,
            "max_eval_prompts": 2,
            "n_samples": 1,
        }
    )
    job = catalog.get("rloo").job_model()(
        settings=settings,
        inputs=TrainingInputs(
            model=str(tiny_model), train_file=str(tmp_path / "prompts.jsonl"), checkpoint_dir=str(tmp_path / "ckpt")
        ),
        output_dir=str(tmp_path / "out"),
        hardware=Hardware(device="cpu"),
    )
    result = catalog.get("rloo").load_worker()(job, Reporter())
    logged = [json.loads(line) for line in (tmp_path / "out" / "progress.jsonl").read_text().splitlines()]
    rows = [r for r in logged if "beta" in r]
    assert [r["step"] for r in rows] == [1, 2, 3]
    beta = 0.05
    for row in rows:  # each step's beta is the rule applied to that step's KL, 8 completions a step
        error = max(-CLIP, min(CLIP, row["kl"] / 1e-6 - 1))
        assert (row["beta"] > beta) == (row["kl"] > 1e-6)  # up when over the target, down when under
        beta *= 1 + error * 8 / 16
        assert row["beta"] == pytest.approx(beta)
    assert rows[0]["kl"] == 0 and rows[0]["beta"] < 0.05  # the first step is the starting model: under target
    assert any(r["kl"] > 1e-6 for r in rows)  # and a later one moved past it
    assert result.beta_end == pytest.approx(rows[-1]["beta"])
    # pass@1 and pass@2 of the accuracy-like reward (numeric) on the held-out prompts, before and after
    for rates in (result.pass_before, result.pass_after):
        assert set(rates) == {"numeric"} and set(rates["numeric"]) == {"pass@1", "pass@2"}
        assert 0 <= rates["numeric"]["pass@1"] <= rates["numeric"]["pass@2"] <= 1
    assert result.pass_samples == 4 and set(result.pass_change["numeric"]) == {"prompts_up", "prompts_down", "p_value"}
    assert "pass@2_after/numeric" in result.figures
    assert json.loads((tmp_path / "out" / "metrics.json").read_text())["beta_end"] == pytest.approx(beta)
