"""Resuming keeps the whole training history (issue 12, item 7): the resumed adapter's progress.jsonl, loss.png
and metrics.json start at step 1, and a resume that changes the run's length is refused before training."""

import json
import shutil

import pytest

from dragon_dagster.engine.config.reporter import Reporter
from dragon_dagster.engine.stages.sft.worker import train_sft
from dragon_dagster.engine.train.trainer import TrainingError
from tests.support import sft_job as job
from tests.support import ticket_files


def rows(directory) -> list[dict]:
    return [json.loads(line) for line in (directory / "progress.jsonl").read_text().splitlines()]


def test_resume_keeps_the_earlier_steps_and_refuses_a_changed_max_steps(tiny_model, tmp_path):
    train, held = ticket_files(tmp_path)
    train_sft(job(tmp_path, tiny_model, train, held, max_steps=4, save_steps=2), Reporter())
    first = rows(tmp_path / "out")
    assert [r["step"] for r in first if r["loss"] is not None] == [1, 2, 3, 4]  # and the end-of-training summary
    checkpoint = tmp_path / "ckpt" / "checkpoint-2"
    kept = tmp_path / "kept-checkpoint-2"  # the resumed run rotates checkpoints in ckpt (save_total_limit)
    shutil.copytree(checkpoint, kept)

    # a fresh output directory, as a resumed materialization gets: nothing of the first run's rows in it
    shutil.rmtree(tmp_path / "out")
    resumed = job(tmp_path, tiny_model, train, held, max_steps=4, save_steps=2)
    resumed.inputs.resume_from = str(checkpoint)
    result = train_sft(resumed, Reporter())
    logged = rows(tmp_path / "out")
    assert [r["step"] for r in logged] == [r["step"] for r in first]  # 1 to 4 as in one run, not only 3 and 4
    assert logged[0]["loss"] == pytest.approx(first[0]["loss"]) and logged[1]["lr"] == pytest.approx(first[1]["lr"])
    assert set(first[0]) <= set(logged[0])  # the same columns the progress callback writes
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["first_loss"] == pytest.approx(first[0]["loss"]) and result.global_step == 4

    changed = job(tmp_path, tiny_model, train, held, max_steps=6, save_steps=2)
    changed.inputs.resume_from = str(kept)
    (tmp_path / "out" / "progress.jsonl").unlink()
    with pytest.raises(TrainingError, match=r"max_steps 4.*max_steps 6.*learning-rate schedule"):
        train_sft(changed, Reporter())
    assert not (tmp_path / "out" / "progress.jsonl").exists()  # refused before anything was written or trained


@pytest.mark.parametrize("loss_kernel", ["chunked", "trl"])
def test_resume_continues_the_token_count(tiny_model, tmp_path, loss_kernel):
    """SFT's cumulative num_tokens goes on from the checkpoint's count (issue 25), as GRPO's does, on both heads."""
    train, held = ticket_files(tmp_path)
    speed = {"loss_kernel": loss_kernel}
    train_sft(job(tmp_path, tiny_model, train, held, speed=speed, max_steps=4, save_steps=2), Reporter())
    first = {r["step"]: r["num_tokens"] for r in rows(tmp_path / "out") if r["loss"] is not None}
    assert 0 < first[1] < first[2] < first[3] < first[4]

    shutil.rmtree(tmp_path / "out")
    resumed = job(tmp_path, tiny_model, train, held, speed=speed, max_steps=4, save_steps=2)
    resumed.inputs.resume_from = str(tmp_path / "ckpt" / "checkpoint-2")
    train_sft(resumed, Reporter())
    logged = {r["step"]: r["num_tokens"] for r in rows(tmp_path / "out") if r["loss"] is not None}
    # the same batches after the checkpoint (the data loader skips the ones trained), so the same running count
    assert logged == first
