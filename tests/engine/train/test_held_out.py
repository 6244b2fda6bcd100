"""Held-out evaluation while training, early stopping and the best checkpoint (issue 62): args.eval_every,
max_eval_rows, early_stopping and keep reach transformers' TrainingArguments and EarlyStoppingCallback for every
training kind, and on a held-out loss made to rise training stops early and keeps the best evaluation's adapter."""

import json

import pytest
import yaml
from pydantic import ValidationError
from safetensors.torch import load_file

from dragon_dagster.engine import catalog
from dragon_dagster.engine.artifacts import progress
from dragon_dagster.engine.config.hardware import Hardware, Speed
from dragon_dagster.engine.config.job import TrainingInputs
from dragon_dagster.engine.config.reporter import Reporter
from dragon_dagster.engine.config.results import KeptAdapter
from dragon_dagster.engine.config.training import TrainArgs
from dragon_dagster.engine.data import tables
from dragon_dagster.engine.stages.sft.worker import train_sft
from dragon_dagster.engine.train import held_out
from dragon_dagster.engine.train.stage import losses_check
from dragon_dagster.engine.train.trl_config import TrainerRun
from tests.engine.stages.test_trl_config import KIND_SETTING
from tests.support import sft_job, ticket_files

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


def test_eval_every_without_held_out_rows_is_refused_before_training():
    with pytest.raises(ValueError, match="this stage has none: give its dataset a held-out split"):
        held_out.eval_dataset([], TrainArgs(eval_every=2), list)
    assert held_out.eval_dataset([], TrainArgs(), list) is None
    assert held_out.eval_dataset([{"i": 1}], TrainArgs(), list) is None  # not scored while training: not built
    assert held_out.eval_dataset([{"i": 1}], TrainArgs(eval_every=2), list) == [{"i": 1}]


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


class Recording(Reporter):
    def __init__(self):
        super().__init__()
        self.logged: list[tuple[int, dict]] = []

    def metrics(self, step, values):
        self.logged.append((step, values))


def test_early_stopping_stops_on_a_rising_held_out_loss_and_keeps_the_best_adapter(tiny_model, tmp_path):
    """Held-out replies that contradict training's (the same prompts, a made-up reply): as the adapter learns the
    training replies at a high learning rate, their held-out loss turns up, and training stops."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    from trl import SFTTrainer

    from dragon_dagster.engine.models import load_tokenizer
    from dragon_dagster.engine.stages.sft import turns
    from dragon_dagster.engine.stages.sft.trl_config import to_trl_config

    train, _ = ticket_files(tmp_path, n=24)
    contradicting = [
        {"prompt": r["prompt"], "completion": [{"role": "assistant", "content": "zebra quartz " * 6}]}
        for r in tables.read_jsonl(train)[:8]
    ]
    tables.write_jsonl(tmp_path / "held.jsonl", contradicting)
    args = dict(max_steps=12, eval_every=2, learning_rate=2e-2, keep="best", max_eval_rows=6)
    job = sft_job(tmp_path, tiny_model, train, tmp_path / "held.jsonl", early_stopping={"patience": 2}, **args)
    reporter = Recording()
    result = train_sft(job, reporter)
    out, kept = tmp_path / "out", result.kept

    rows = progress.read(out)
    curve = {r["step"]: r["eval_loss"] for r in rows if isinstance(r.get("eval_loss"), (int, float))}
    best = min(curve, key=curve.get)
    assert kept.stopped_early and kept.patience == 2  # the callback was in the trainer's callbacks, and fired
    assert result.global_step == kept.last_step < 12 and kept.planned_steps == 12
    assert sorted(curve) == list(range(2, kept.last_step + 1, 2)) and kept.evaluations == len(curve)
    assert kept.step == kept.best_step == best < kept.last_step and kept.best_metric == pytest.approx(curve[best])
    assert result.held_out_rows.scored == 6 and result.held_out_rows.total == 8
    assert result.metadata()["adapter_step"].startswith(
        f"stopped at step {kept.last_step} of 12 (held-out loss did not improve for 2 evaluations); kept step {best}"
    )
    assert json.loads((out / "metrics.json").read_text())["kept"]["step"] == best  # into the manifest's result

    # the saved adapter is the best evaluation's checkpoint, not the last step's
    saved = load_file(out / "adapter" / "adapter_model.safetensors")
    for step, same in ((best, True), (kept.last_step, False)):
        checkpoint = load_file(tmp_path / "ckpt" / f"checkpoint-{step}" / "adapter_model.safetensors")
        assert all(saved[k].equal(checkpoint[k]) for k in saved) is same, step
    # and scored afresh on the same held-out rows, its loss is that evaluation's
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model), out / "adapter")
    scored = turns.training_dataset(held_out.sample_rows(contradicting, 6, job.settings.args.seed), "final_turn")
    scorer = SFTTrainer(
        model=model,
        args=to_trl_config(job.settings, TrainerRun(Hardware(device="cpu"), str(tmp_path / "rescore"))),
        train_dataset=scored,  # SFTTrainer wants one; only evaluate runs
        eval_dataset=scored,
        processing_class=load_tokenizer(str(tiny_model)),
    )
    assert scorer.evaluate()["eval_loss"] == pytest.approx(curve[best], rel=1e-4)

    # the held-out curve is its own MLflow series on the training steps' axis; the training rows stay the loss's
    evaluated = {step for step, values in reporter.logged if "train/eval_loss" in values}
    trained = {step for step, values in reporter.logged if "train/loss" in values}
    assert evaluated == set(curve) and evaluated <= trained
    outcome = losses_check().judge(out)
    assert outcome.metadata["logged_steps"] == len([r for r in rows if r.get("loss") is not None]) == kept.last_step


def test_the_loss_plot_draws_the_held_out_curves_beside_the_training_ones(tmp_path, monkeypatch):
    import matplotlib.axes

    from dragon_dagster.engine.evaluate.plots import plot_loss

    shown, legend = [], matplotlib.axes.Axes.legend
    monkeypatch.setattr(
        matplotlib.axes.Axes,
        "legend",
        lambda self, handles, labels, **kw: (shown.extend(labels), legend(self, handles, labels, **kw))[1],
    )
    rows = [  # a GRPO stage's progress rows: training steps, then an evaluation's row (eval_* keys, no loss)
        {"step": 1, "loss": 0.2, "reward": 0.1},
        {"step": 2, "loss": 0.1, "reward": 0.3},
        {"step": 2, "loss": None, "eval_loss": 0.15, "eval_reward": 0.25},
    ]
    assert plot_loss(rows, tmp_path / "loss.png", extra="reward").read_bytes().startswith(b"\x89PNG")
    assert shown == ["train loss", "eval loss", "reward", "held-out reward"]


def test_a_dpo_stage_logs_its_held_out_reward_accuracy_while_training(tiny_model, tmp_path, monkeypatch):
    """A preference kind's held-out curve is TRL's eval figures (reward accuracy and margins) every eval_every
    steps, as MLflow series beside the training ones; early stopping watches the one it is told to."""
    from dragon_dagster.engine.stages.dpo import worker

    train, _ = ticket_files(tmp_path, n=8)
    pairs = [
        {"prompt": r["prompt"], "chosen": r["completion"], "rejected": [{"role": "assistant", "content": "Wait."}]}
        for r in tables.read_jsonl(train)
    ]
    tables.write_jsonl(tmp_path / "pairs.jsonl", pairs[:4])
    tables.write_jsonl(tmp_path / "held.jsonl", pairs[4:7])
    args = {"max_steps": 2, "batch_size": 2, "grad_accum": 1, "logging_steps": 1, "max_seq_len": 96}
    watched = {"patience": 5, "metric": "eval_rewards/accuracies"}
    settings = {**args, "eval_every": 1, "max_eval_rows": 2, "early_stopping": watched}
    stage = catalog.parse_stage({"name": "d", "kind": "dpo", "dataset": "pairs", "args": settings, "n_samples": 0})
    (tmp_path / "out").mkdir()
    job = catalog.get("dpo").job_model()(
        settings=stage,
        inputs=TrainingInputs(
            model=str(tiny_model),
            train_file=str(tmp_path / "pairs.jsonl"),
            eval_file=str(tmp_path / "held.jsonl"),
            checkpoint_dir=str(tmp_path / "ckpt"),
        ),
        output_dir=str(tmp_path / "out"),
        hardware=Hardware(device="cpu"),
        speed=Speed(),
    )
    built, trainer = [], worker.DPOMethod.trainer
    monkeypatch.setattr(worker.DPOMethod, "trainer", lambda self, *a: built.append(trainer(self, *a)) or built[-1])
    reporter = Recording()
    result = worker.train_dpo(job, reporter)

    (stopper,) = [c for c in built[0].callback_handler.callbacks if type(c).__name__ == "EarlyStoppingCallback"]
    assert stopper.early_stopping_patience == 5 and built[0].args.metric_for_best_model == watched["metric"]
    assert len(built[0].eval_dataset) == 2 and result.held_out_rows.model_dump() == {
        "scored": 2,
        "total": 3,
        "setting": "args.max_eval_rows",
    }
    rows = progress.read(tmp_path / "out")
    during = [r for r in rows if "eval_rewards/margins" in r and r["loss"] is None]
    assert [r["step"] for r in during][:2] == [1, 2]  # then the final evaluation's, at the last step
    logged = {step for step, values in reporter.logged if "train/eval_rewards/accuracies" in values}
    assert {1, 2} <= logged
    kept = result.kept
    assert (kept.keep, kept.step, kept.evaluations, kept.greater_is_better) == ("last", 2, 2, True)
    assert kept.best_metric == max(r["eval_rewards/accuracies"] for r in during[:2])
    assert losses_check().judge(tmp_path / "out").metadata["logged_steps"] == 2
