"""The reinforcement levers of train/reinforce/: the adaptive KL controller (beta up while the KL is over its target,
down while under, by the clipped proportional rule, and in a training run the trainer's beta after each logged
step), pass@k on the held-out prompts, and the difficulty filter (exactly the prompts right some of the time)."""

import json

import pytest

from dragon_dagster.engine.train.reinforce.kl_control import AdaptiveKL


def train(tiny_model, tmp_path, rows: list[dict], stage: dict, **args):
    """Train a reinforcement stage of 3 logged steps on rows with the tiny model; (result, progress rows)."""
    from dragon_dagster.engine import catalog
    from dragon_dagster.engine.config.hardware import Hardware
    from dragon_dagster.engine.config.job import TrainingInputs
    from dragon_dagster.engine.config.reporter import Reporter
    from dragon_dagster.engine.data import tables

    tables.write_jsonl(tmp_path / "prompts.jsonl", rows)
    (tmp_path / "out").mkdir()
    steps = {"max_steps": 3, "batch_size": 2, "grad_accum": 1, "logging_steps": 1, "save_steps": 100}
    settings = catalog.parse_stage(
        {
            "name": f"{stage['kind']}_adapter",
            "dataset": "prompts",
            "args": {**steps, "warmup_ratio": 0.0, **args},
            "group_size": 4,
            "max_new_tokens": 6,
            "max_eval_prompts": 2,
            **stage,
        }
    )
    kind = catalog.get(settings.kind)
    job = kind.job_model()(
        settings=settings,
        inputs=TrainingInputs(
            model=str(tiny_model), train_file=str(tmp_path / "prompts.jsonl"), checkpoint_dir=str(tmp_path / "ckpt")
        ),
        output_dir=str(tmp_path / "out"),
        hardware=Hardware(device="cpu"),
    )
    result = kind.load_worker()(job, Reporter())
    logged = [json.loads(line) for line in (tmp_path / "out" / "progress.jsonl").read_text().splitlines()]
    return result, logged


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
    from dragon_dagster.engine.data import row_mapping, tables
    from dragon_dagster.engine.pipeline.definition import EXAMPLE_DIR
    from dragon_dagster.engine.train.reinforce.kl_control import CLIP

    prompts = row_mapping.map_prompts(
        tables.read_table(EXAMPLE_DIR / "arithmetic.csv"),
        row_mapping.PromptsMapping(prompt="question", reference="answer"),
    )[:12]
    stage = {
        "kind": "rloo",
        "rewards": [{"type": "length", "max_chars": 24}, {"type": "numeric", "weight": 0.5}],
        "pass_samples": 4,  # pass@k, measured in the same run
        "pass_k": 2,
        "beta": 0.05,
        "kl_target": 1e-6,  # far below what an update reaches: beta rises after one, falls after a step at 0
        "kl_horizon": 16,
        "n_samples": 1,
    }
    result, logged = train(tiny_model, tmp_path, prompts, stage, learning_rate=5e-2)
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
    (change,) = result.pass_at_k
    assert (change.reward, change.model, change.against, change.samples, change.k) == (
        "numeric",
        "rloo_adapter",
        "start",
        4,
        2,
    )
    assert change.prompts == result.eval_prompts and change.temperature == result.temperature
    for when in ("before", "after"):
        assert 0 <= getattr(change, f"pass1_{when}") <= getattr(change, f"passk_{when}") <= 1
    assert change.prompts_up + change.prompts_down <= change.prompts and 0 < change.p_value <= 1
    assert "pass_at_2_after/numeric" in result.figures
    assert json.loads((tmp_path / "out" / "metrics.json").read_text())["beta_end"] == pytest.approx(beta)


def test_the_difficulty_filter_keeps_exactly_the_prompts_right_some_of_the_time(tiny_model, tmp_path):
    """On a fixed model and seed: a reward right on every sample of one prompt, on none of another, and on some of
    the rest (by the sample's length) keeps the mixed ones and no other, as right_counts finds them."""
    from dragon_dagster.engine import catalog, models
    from dragon_dagster.engine.config.hardware import Hardware
    from dragon_dagster.engine.config.reporter import Reporter
    from dragon_dagster.engine.evaluate.pass_at_k import right_counts
    from dragon_dagster.engine.rewards import RewardSet
    from dragon_dagster.engine.train.reinforce.worker import keep_mixed

    (tmp_path / "judge.py").write_text(
        "def reward(prompt, completion, reference, row):\n"
        "    if reference == 'always':\n        return 1.0\n"
        "    if reference == 'never':\n        return 0.0\n"
        "    return float(len(completion) % 2 == 0)\n"
    )
    rows = [
        {"prompt": [{"role": "user", "content": f"Question {i}?"}], "reference": ref}
        for i, ref in enumerate(["always", "never", "mixed", "mixed", "mixed", "always"])
    ]
    settings = catalog.parse_stage(
        {
            "name": "g",
            "kind": "grpo",
            "dataset": "p",
            "rewards": [{"type": "custom", "file": str(tmp_path / "judge.py"), "name": "judge"}],
            "difficulty_samples": 6,
            "temperature": 1.0,
            "max_new_tokens": 6,
        }
    )
    rewards = RewardSet(settings.rewards)
    model, tokenizer = (
        models.load_model(str(tiny_model), Hardware(device="cpu")),
        models.load_tokenizer(str(tiny_model)),
    )
    kept, found = keep_mixed(model, tokenizer, rows, rewards, settings, Reporter())
    counts = right_counts(model, tokenizer, rows, rewards, 6, 1.0, 6, settings.args.seed)["judge"]
    assert counts[0] == counts[5] == 6 and counts[1] == 0  # the fixed ends
    expected = [row for row, c in zip(rows, counts) if 0 < c < 6]
    assert kept == expected and expected  # exactly the mixed ones, and there are some
    assert found["always_right"] == 2 and found["never_right"] == 1 + sum(c == 0 for c in counts[2:5])
    assert found["kept"] == len(expected) and found["kept_share"] == pytest.approx(len(expected) / 6)


def test_the_difficulty_filter_needs_an_accuracy_reward_and_two_samples():
    from dragon_dagster.engine import catalog

    stage = {"name": "g", "kind": "rloo", "dataset": "p", "rewards": [{"type": "length", "max_chars": 9}]}
    with pytest.raises(ValueError, match="keeps prompts by how often they are right"):
        catalog.parse_stage({**stage, "difficulty_samples": 4})
    with pytest.raises(ValueError, match="difficulty_samples 1 cannot tell"):
        catalog.parse_stage({**stage, "rewards": [{"type": "numeric"}], "difficulty_samples": 1})
    with pytest.raises(ValueError, match="pass_k \\(8\\) is more tries than the pass_samples \\(4\\)"):
        catalog.parse_stage({**stage, "pass_samples": 4, "pass_k": 8})
    with pytest.raises(ValueError, match="kl_target moves beta from its starting value, and beta is 0"):
        catalog.parse_stage({**stage, "kl_target": 0.1, "beta": 0})


def test_kept_groups_drops_the_groups_that_all_scored_the_same():
    import torch

    from dragon_dagster.engine.train.reinforce.trainer import kept_groups

    advantages = torch.tensor([0.0, 0.0, 0.0, 0.5, -0.5, 0.0, 0.0, 0.0, 0.0])  # groups of 3: flat, spread, flat
    assert kept_groups(advantages, 3).tolist() == [False] * 3 + [True] * 3 + [False] * 3
    assert kept_groups(torch.zeros(6), 3) is None  # every group flat: nothing to keep, nothing dropped
    assert kept_groups(advantages[:8], 3) is None  # not whole groups (split across processes): left as TRL has it


def test_a_grpo_stage_leaves_flat_groups_out_of_its_loss(tiny_model, tmp_path):
    """Prompts the judge always passes make flat groups; each step drops exactly the share of groups that scored
    the same (what the stage's groups.jsonl records per scoring round), and a step with no spread drops none."""
    (tmp_path / "judge.py").write_text(
        "def reward(prompt, completion, reference, row):\n"
        "    return 1.0 if reference == 'always' else float(len(completion) % 2 == 0)\n"
    )
    rows = [
        {"prompt": [{"role": "user", "content": f"Question {i}?"}], "reference": "always" if i % 2 else "mixed"}
        for i in range(8)
    ]
    stage = {
        "kind": "grpo",
        "rewards": [{"type": "custom", "file": str(tmp_path / "judge.py"), "name": "judge"}],
        "drop_flat_groups": True,
        "n_samples": 0,
    }
    _, logged = train(tiny_model, tmp_path, rows, stage, learning_rate=1e-2, seed=3)
    dropped = [r["flat_groups_dropped"] for r in logged if "flat_groups_dropped" in r]
    flat = [json.loads(line)["zero_std_frac"] for line in (tmp_path / "out" / "groups.jsonl").read_text().splitlines()]
    assert len(dropped) == 3 and len(flat) == 3
    assert dropped == [0.0 if share == 1.0 else share for share in flat]
    assert any(0 < d < 1 for d in dropped)  # some step had both a flat group and one with spread
