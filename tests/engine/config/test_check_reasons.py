"""A failed check says why and which setting fixes it (the Dagster UI shows the text with the check, `dragon demo`
prints it): an outcome without a reason is refused, and the checks judged from artifacts here give one."""

import json

import pytest

from dragon_dagster.engine.artifacts import progress
from dragon_dagster.engine.config.checks import CheckOutcome
from dragon_dagster.engine.data.checks import quality_check
from dragon_dagster.engine.train.reinforce.checks import kl_check
from dragon_dagster.engine.train.stage import losses_check


def test_a_failed_outcome_without_a_reason_is_refused():
    with pytest.raises(ValueError, match="needs a description"):
        CheckOutcome(False, {"figure": 1})
    assert CheckOutcome(True).description is None


def test_duplicates_name_their_share_and_the_fix(tmp_path):
    row = {"prompt": [{"role": "user", "content": "hi"}], "completion": [{"role": "assistant", "content": "hello"}]}
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(row) for _ in range(4)) + "\n")
    (tmp_path / "eval.jsonl").write_text("")
    outcome = quality_check().judge(tmp_path)
    assert not outcome.passed and outcome.severity == "warn"
    assert outcome.description.startswith("75% of the rows are duplicates (the limit is 20%)")


def test_a_runaway_kl_and_a_rising_loss_say_what_to_change(tmp_path):
    progress.write(tmp_path, [{"step": 1, "loss": 0.5, "kl": 0.2}, {"step": 2, "loss": 0.7, "kl": 3.5}])
    kl = kl_check(1.0).judge(tmp_path)
    assert not kl.passed and "reached 3.5, above kl_bound=1.0" in kl.description
    assert "args.learning_rate" in kl.description and "beta" in kl.description
    loss = losses_check().judge(tmp_path)
    assert not loss.passed and "The last logged loss (0.7) is not below the first (0.5)" in loss.description
    progress.write(tmp_path, [{"step": 1, "loss": 0.5, "kl": 0.2}, {"step": 2, "loss": 0.4, "kl": 0.3}])
    assert kl_check(1.0).judge(tmp_path).description is None and losses_check().judge(tmp_path).passed
