"""A few SFT steps on a large dataset prepare only the rows they reach (issue 63): with max_steps set, TRL is given a
seeded sample of max_steps x batch_size x grad_accum training rows, not every row to tokenize for nothing. That the
sft stage's trainer receives them: tests/engine/stages/test_training_kinds.py (its 4 steps of 2 rows train 8 rows)."""

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
