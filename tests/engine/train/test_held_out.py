"""Held-out evaluation while training, early stopping and the best checkpoint (issue 62): args.eval_every,
max_eval_rows, early_stopping and keep reach transformers' TrainingArguments and EarlyStoppingCallback for every
training kind, and on a held-out loss made to rise training stops early and keeps the best evaluation's adapter."""

import pytest
import yaml
from pydantic import ValidationError

from dragon_dagster.engine import catalog
from dragon_dagster.engine.config.hardware import Hardware, Speed
from dragon_dagster.engine.config.job import TrainingInputs
from dragon_dagster.engine.config.results import KeptAdapter
from dragon_dagster.engine.config.training import TrainArgs
from dragon_dagster.engine.train import held_out
from dragon_dagster.engine.train.trl_config import TrainerRun
from tests.engine.stages.test_trl_config import KIND_SETTING

WATCHED = "args: {eval_every: 5, save_steps: 100, keep: best, early_stopping: {patience: 3, min_delta: 0.01%s}}"


def config_of(kind_name: str, args_yaml: str, tmp_path):
    own = KIND_SETTING[kind_name][0]
    stage = catalog.parse_stage(yaml.safe_load(f"name: s\nkind: {kind_name}\ndataset: rows\n{args_yaml}\n{own}\n"))
    inputs = TrainingInputs(model="tiny", train_file=str(tmp_path / "t.jsonl"), checkpoint_dir=str(tmp_path / "c"))
    kind = catalog.get(kind_name)
    job = kind.job_model()(settings=stage, inputs=inputs, output_dir=str(tmp_path), hardware=Hardware(device="cpu"))
    return kind.load_trl_config()(stage, TrainerRun.of(job, Speed().resolve("cpu"))), stage


REWARDED = ("grpo", "rloo")  # their held-out figure is TRL's eval_reward: higher is better


@pytest.mark.parametrize("kind_name", sorted(KIND_SETTING))
def test_the_settings_reach_every_kinds_training_arguments(kind_name, tmp_path):
    rewarded = kind_name in REWARDED
    config, stage = config_of(kind_name, WATCHED % (", metric: eval_reward" if rewarded else ""), tmp_path)
    assert (config.eval_strategy, config.eval_steps) == ("steps", 5)
    assert config.load_best_model_at_end
    assert (config.metric_for_best_model, config.greater_is_better) == (
        ("eval_reward", True) if rewarded else ("eval_loss", False)
    )
    assert config.save_steps == 5  # lined up with the evaluations, so the best one's checkpoint exists
    (stopper,) = held_out.callbacks(stage.args)
    assert type(stopper).__name__ == "EarlyStoppingCallback"
    assert (stopper.early_stopping_patience, stopper.early_stopping_threshold) == (3, 0.01)

    plain, _ = config_of(kind_name, "args: {save_steps: 100}", tmp_path)
    assert plain.eval_strategy == "no" and not plain.load_best_model_at_end and plain.save_steps == 100


def test_a_metric_other_than_a_loss_is_better_higher(tmp_path):
    config, _ = config_of("dpo", WATCHED % ", metric: eval_rewards/accuracies", tmp_path)
    assert config.metric_for_best_model == "eval_rewards/accuracies" and config.greater_is_better is True
    last, _ = config_of("sft", "args: {eval_every: 4, save_steps: 10, early_stopping: {patience: 2}}", tmp_path)
    # keep: last still tracks the best evaluation (for the manifest) and keeps its own checkpoint schedule
    assert not last.load_best_model_at_end and last.metric_for_best_model == "eval_loss" and last.save_steps == 10


@pytest.mark.parametrize("kind_name", REWARDED)
def test_a_reinforcement_stage_watches_its_held_out_reward(kind_name, tmp_path):
    config, _ = config_of(kind_name, "args: {eval_every: 5, keep: best}", tmp_path)
    assert (config.metric_for_best_model, config.greater_is_better) == ("eval_reward", True)
    with pytest.raises(ValidationError, match="policy-gradient loss is no measure.*metric: eval_reward"):
        config_of(kind_name, WATCHED % "", tmp_path)


@pytest.mark.parametrize("asked", [{"early_stopping": {"patience": 3}}, {"keep": "best"}])
def test_early_stopping_and_keep_best_need_eval_every(asked):
    with pytest.raises(ValidationError, match="only scored with eval_every: set args.eval_every"):
        TrainArgs(**asked)
    with pytest.raises(ValidationError, match="patience"):
        TrainArgs(eval_every=5, early_stopping={"patience": 0})


def test_max_eval_rows_is_a_seeded_sample_in_the_splits_order():
    rows = [{"i": i} for i in range(1000)]
    first = held_out.sample_rows(rows, 200, seed=42)
    assert first == held_out.sample_rows(rows, 200, seed=42)  # the same rows every run
    assert len(first) == 200 and [r["i"] for r in first] == sorted(r["i"] for r in first)
    assert first != held_out.sample_rows(rows, 200, seed=7) and first != rows[:200]
    assert held_out.sample_rows(rows[:50], 200, seed=42) == rows[:50]
    assert held_out.sample_rows(rows, None, seed=42) == rows
    assert TrainArgs().max_eval_rows == 200


def test_the_sentence_the_asset_page_shows():
    kept = KeptAdapter(
        keep="best",
        step=80,
        metric="eval_loss",
        best_step=80,
        best_metric=1.234,
        evaluations=7,
        eval_every=20,
        last_step=140,
        planned_steps=400,
        stopped_early=True,
        patience=3,
    )
    assert kept.sentence() == (
        "stopped at step 140 of 400 (held-out loss did not improve for 3 evaluations); kept step 80, "
        "the best held-out loss (1.234) at step 80"
    )
    ran = kept.model_copy(update={"keep": "last", "step": 400, "last_step": 400, "stopped_early": False})
    assert ran.sentence() == "ran 400 of 400 steps; kept the last step (400); the best held-out loss (1.234) at step 80"
