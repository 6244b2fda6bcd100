"""A few steps on a large dataset prepare only the rows they reach (issue 63: SFT, the preference kinds, the reward
model): with max_steps set, TRL is given a seeded sample of max_steps x batch_size x grad_accum training rows, not
every row to tokenize for nothing. That the sft stage's trainer receives them: tests/engine/stages/
test_training_kinds.py (its 4 steps of 2 rows train 8 rows); DPO's and the reward model's: below."""

import pytest

from dragon_dagster.engine.config.reporter import Reporter
from dragon_dagster.engine.config.training import TrainArgs
from dragon_dagster.engine.train.trainer import rows_for_steps
from tests.support import Recorded


def test_max_steps_bounds_the_training_rows_to_a_seeded_sample_and_epochs_take_every_row():
    rows = [{"n": i} for i in range(100)]
    args = TrainArgs(max_steps=3, batch_size=4, grad_accum=2, seed=1)
    reached = rows_for_steps(rows, args, Recorded())
    assert len(reached) == 24 and reached == rows_for_steps(rows, args, Reporter()), "the same rows each run"
    assert reached != rows[:24] and [r["n"] for r in reached] == sorted(r["n"] for r in reached)
    assert reached != rows_for_steps(rows, args.model_copy(update={"seed": 2}), Reporter())
    assert rows_for_steps(rows, TrainArgs(epochs=1), Reporter()) == rows, "epochs: every row, every time"
    assert rows_for_steps(rows[:20], args, Reporter()) == rows[:20], "fewer rows than the steps reach: all"


def pairs_job(kind: str, tiny_model, tmp_path, n: int):
    """A job of the kind on n distinct preference pairs, 2 steps of 2 pairs."""
    from dragon_dagster.engine import catalog
    from dragon_dagster.engine.config.hardware import Hardware
    from dragon_dagster.engine.config.job import TrainingInputs
    from dragon_dagster.engine.data import tables

    def pair(i):
        return {
            "prompt": [{"role": "user", "content": f"Where is parcel {i}?"}],
            "chosen": [{"role": "assistant", "content": f"Parcel {i} arrives on Monday."}],
            "rejected": [{"role": "assistant", "content": "No idea."}],
        }

    tables.write_jsonl(tmp_path / "pairs.jsonl", [pair(i) for i in range(n)])
    settings = catalog.get(kind).settings(
        name=f"{kind}_stage",
        kind=kind,
        dataset="pairs",
        args={"max_steps": 2, "batch_size": 2, "grad_accum": 1, "max_seq_len": 64, "logging_steps": 1},
    )
    return catalog.get(kind).job_model()(
        settings=settings,
        inputs=TrainingInputs(
            model=str(tiny_model), train_file=str(tmp_path / "pairs.jsonl"), checkpoint_dir=str(tmp_path / "ckpt")
        ),
        output_dir=str(tmp_path),
        hardware=Hardware(device="cpu"),
    )


@pytest.mark.parametrize("kind", ["dpo", "reward_model"])
def test_preference_kinds_train_only_the_pairs_their_steps_reach_and_count_the_split(kind, tiny_model, tmp_path):
    """2 steps of 2 pairs reach 4 of the 30: the trainer is given those (the log says so); the result counts the
    split (the reward model's train_pairs: every pair)."""
    from dragon_dagster.engine import catalog

    reporter = Recorded()
    result = catalog.get(kind).load_worker()(pairs_job(kind, tiny_model, tmp_path, 30), reporter)
    assert any("reach 4 of the 30 training rows" in line for line in reporter.lines), reporter.lines
    assert any(line.startswith("training 4 rows for 2 steps") for line in reporter.lines), reporter.lines
    assert result.global_step == 2
    if kind == "reward_model":
        assert result.train_pairs == 30
