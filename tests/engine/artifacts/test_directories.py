"""The runs directory survives kills and moves: durable read-only artifacts, stale staging cleaned by owner,
resume from the newest complete checkpoint, each run deleting only its own checkpoints (the MLflow store's own
moves: tests/resources/test_tracking_relocation.py). Real directories and a real tiny training run throughout."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from dragon_dagster.engine.artifacts import checkpoints
from dragon_dagster.engine.artifacts import directories as artifacts
from dragon_dagster.engine.artifacts.manifest import Manifest, read_manifest, write_manifest
from dragon_dagster.engine.config.reporter import Reporter
from dragon_dagster.engine.runs import list_artifacts
from dragon_dagster.engine.stages.sft import worker as sft
from dragon_dagster.engine.train import trainer
from dragon_dagster.resources import ArtifactStore
from tests.support import sft_job as job
from tests.support import ticket_files

ROOT = os.geteuid() == 0  # root ignores write bits: there the mode bits are what a test can check


def write_bits(path: Path) -> list[Path]:
    """Everything under path (path included) that still has a write bit."""
    return [p for p in [path, *path.rglob("*")] if not p.is_symlink() and p.lstat().st_mode & 0o222]


ABANDONED = []  # their context managers, held so that no generator cleanup runs: a SIGKILL runs none either


def abandon(store: ArtifactStore, run_id: str, stage: str = "sft_dataset") -> Path:
    """A staging directory as a killed write leaves it: entered through the real code path, never exited."""
    cm = store.new_artifact("tiny", stage, run_id)
    ABANDONED.append(cm)
    tmp, _final = cm.__enter__()
    (tmp / "data").mkdir()
    (tmp / "data" / "train.jsonl").write_text("{}\n")
    return tmp


def age(path: Path, seconds: float) -> None:
    """Make path and everything under it look last written `seconds` ago."""
    then = time.time() - seconds
    for p in [*path.rglob("*"), path]:
        os.utime(p, (then, then), follow_symlinks=False)


# ----------------------------------------------------------------------------------------------- artifacts


def test_a_finished_artifact_is_fsynced_before_its_rename_then_read_only(tmp_path, monkeypatch):
    store = ArtifactStore(runs_dir=str(tmp_path / "runs"))
    events = []
    real_fsync, real_rename = os.fsync, os.rename

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def rename(src, dst, *args, **kwargs):
        events.append(("rename", str(src), str(dst)))
        return real_rename(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", rename)
    run_id = "0f1e2d3c-aaaa-bbbb-cccc-1234567890ab"  # a Dagster run id
    with store.new_artifact("tiny", "sft_adapter", run_id) as (tmp, final):
        assert tmp.name.startswith(".tmp-") and artifacts.staging_owner(tmp.name) == run_id
        (tmp / "adapter").mkdir()
        (tmp / "adapter" / "adapter_config.json").write_text("{}")
        write_manifest(tmp, Manifest(kind="adapter"))
    monkeypatch.undo()

    renamed = [i for i, e in enumerate(events) if e[0] == "rename" and e[2] == str(final)]
    assert len(renamed) == 1
    synced_before = {e[1] for e in events[: renamed[0]] if e[0] == "fsync"}
    assert {
        str(tmp / "adapter" / "adapter_config.json"),
        str(tmp / "manifest.json"),
        str(tmp / "adapter"),
        str(tmp),
    } <= synced_before  # files, subdirectories and the directory itself, before its name
    assert ("fsync", str(final.parent)) in events[renamed[0] :]  # and the new name after
    assert not tmp.exists() and final.is_dir()

    assert write_bits(final) == []  # files and directories alike
    assert artifacts.is_read_only(final) and read_manifest(final).kind == "adapter"
    if not ROOT:
        with pytest.raises(PermissionError):
            (final / "manifest.json").write_text("{}")
        with pytest.raises(PermissionError):
            (final / "extra.txt").write_text("x")
    assert [r["dir"] for r in list_artifacts(store.root)] == [str(final)]

    with pytest.raises(FileExistsError):  # finished artifacts are never replaced
        with artifacts.staged_dir(final):
            pass
    artifacts.remove_tree(final)  # deletes read-only trees (rmtree alone cannot for a non-root user)
    assert not final.exists() and list(final.parent.iterdir()) == []


def test_a_failed_write_leaves_nothing(tmp_path):
    store = ArtifactStore(runs_dir=str(tmp_path / "runs"))
    with pytest.raises(RuntimeError):
        with store.new_artifact("tiny", "sft_adapter", "run-1") as (tmp, final):
            (tmp / "x").write_text("half")
            raise RuntimeError("the trainer failed")
    assert list(final.parent.iterdir()) == [] and not final.exists()


def test_stale_staging_is_removed_only_when_no_live_run_owns_it(tmp_path):
    store = ArtifactStore(runs_dir=str(tmp_path / "runs"))
    dead_old = abandon(store, "dead-run")
    live_old = abandon(store, "live-run", stage="sft_adapter")
    dead_fresh = abandon(store, "dead-run-2")
    unknown = abandon(store, "is-live-fails")
    age(dead_old, 3600)
    age(live_old, 3600)
    age(unknown, 3600)
    artifacts.make_read_only(dead_old)  # a read-only leftover goes as well
    legacy_old = dead_old.parent / ".tmp-20240101-000000-abcdef12-1a2b3c"  # staging name without its run
    legacy_fresh = dead_old.parent / ".tmp-20240102-000000-abcdef12-4d5e6f"
    for path in (legacy_old, legacy_fresh):
        path.mkdir()
        (path / "f").write_text("x")
    age(legacy_old, 3 * 86400)
    with store.new_artifact("tiny", "sft_dataset", "done-run") as (tmp, finished):
        (tmp / "train.jsonl").write_text("{}\n")
    age(finished, 3 * 86400)

    asked, logged = [], []

    def is_live(run_id: str) -> bool:
        asked.append(run_id)
        if run_id == "is-live-fails":
            raise ConnectionError("instance unavailable")
        return run_id == "live-run"

    removed = store.clean_stale_staging(is_live, min_age_s=600, unowned_min_age_s=86400, log=logged.append)
    assert sorted(removed) == sorted([dead_old, legacy_old])
    for gone in (dead_old, legacy_old):
        assert not gone.exists()
    for kept in (live_old, dead_fresh, unknown, legacy_fresh, finished):
        assert kept.exists()
    assert "dead-run-2" not in asked  # written to recently: not even asked
    assert any("is-live-fails" in line for line in logged)
    assert store.clean_stale_staging(is_live, min_age_s=600) == []  # idempotent


# ------------------------------------------------------------------------------------------------- checkpoints


def fake_checkpoint(path: Path, step: int) -> Path:
    """Directory shaped like a complete LoRA checkpoint (for the deletion test; the real ones are below)."""
    path.mkdir(parents=True)
    (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    for name in ("adapter_model.safetensors", "optimizer.pt", "scheduler.pt"):
        (path / name).write_bytes(b"x")
    return path


def test_a_run_discards_its_own_checkpoints_and_the_one_it_resumed_from_only(tmp_path):
    store = ArtifactStore(runs_dir=str(tmp_path / "runs"))
    mine = store.checkpoint_dir("tiny", "sft_adapter", "run-mine")
    fake_checkpoint(mine / "checkpoint-2", 2)
    resumed = fake_checkpoint(store.checkpoint_dir("tiny", "sft_adapter", "run-cancelled") / "checkpoint-4", 4)
    training = fake_checkpoint(store.checkpoint_dir("tiny", "sft_adapter", "run-still-training") / "checkpoint-6", 6)
    other_stage = fake_checkpoint(store.checkpoint_dir("tiny", "dpo_adapter", "run-mine") / "checkpoint-2", 2)

    removed = store.discard_checkpoints("tiny", "sft_adapter", "run-mine", resumed_from=resumed)
    assert removed == [mine, resumed.parent]
    assert not mine.exists() and not resumed.parent.exists()
    assert training.exists() and other_stage.exists()  # another run's, another stage's
    assert store.discard_checkpoints("tiny", "sft_adapter", "run-mine") == []

    elsewhere = fake_checkpoint(tmp_path / "elsewhere" / "checkpoint-1", 1)
    assert store.discard_checkpoints("tiny", "sft_adapter", "run-x", resumed_from=elsewhere) == []
    assert elsewhere.exists()
    for bad in ("", "..", "../dpo_adapter", "a/b"):
        with pytest.raises(ValueError):
            store.discard_checkpoints("tiny", "sft_adapter", bad)
    assert training.exists() and other_stage.exists()

    # a run still training is not resumed from: its checkpoints are being written and rotated
    assert store.latest_checkpoint("tiny", "sft_adapter") == training
    assert store.latest_checkpoint("tiny", "sft_adapter", is_live=lambda run: run == "run-still-training") is None


def test_leftovers_go_but_the_checkpoint_resume_would_pick_and_live_runs_files_stay(tmp_path):
    """clean_leftovers (issue 25): checkpoints no resume would pick and the Pipes folders of ended runs go, each
    removal logged with its size; the pick, live runs' files, fresh ones and a run it cannot ask about stay."""
    store = ArtifactStore(runs_dir=str(tmp_path / "runs"))

    def checkpoints(run: str, step: int, hours_ago: float, stage: str = "sft_adapter", complete: bool = True) -> Path:
        path = fake_checkpoint(store.checkpoint_dir("tiny", stage, run) / f"checkpoint-{step}", step)
        if not complete:  # killed during the save
            (path / "trainer_state.json").unlink()
        age(path.parent, hours_ago * 3600)
        return path.parent

    superseded = checkpoints("run-killed-first", 2, hours_ago=3)  # a newer complete one is in run-killed-last
    pick = checkpoints("run-killed-last", 4, hours_ago=2)
    half_saved = checkpoints("run-killed-saving", 6, hours_ago=1, complete=False)  # newer, but never picked
    live = checkpoints("run-live", 8, hours_ago=1)
    fresh = checkpoints("run-just-ended", 8, hours_ago=0, complete=False)  # written to a moment ago
    unknown = checkpoints("is-live-fails", 1, hours_ago=5)
    only_one = checkpoints("run-killed-first", 2, hours_ago=3, stage="dpo_adapter")  # that stage's pick

    def pipes(run: str, hours_ago: float) -> Path:
        folder = store.new_pipes_dir(run, "tiny__sft_adapter")
        folder.mkdir(parents=True)
        (folder / "messages").write_text('{"method": "opened"}\n' * 1000)  # 21 KiB
        age(folder.parent, hours_ago * 3600)
        return folder.parent

    dead_pipes, live_pipes, fresh_pipes = pipes("run-killed-first", 2), pipes("run-live", 2), pipes("run-new", 0)

    logged = []

    def is_live(run_id: str) -> bool:
        if run_id == "is-live-fails":
            raise ConnectionError("instance unavailable")
        return run_id == "run-live"

    removed = store.clean_leftovers(is_live, min_age_s=600, log=logged.append)
    assert sorted(removed) == sorted([superseded, half_saved, dead_pipes])
    for kept in (pick, live, fresh, unknown, only_one, live_pipes, fresh_pipes):
        assert kept.exists(), kept
    for gone in removed:
        assert not gone.exists()
        (line,) = [line for line in logged if "removed" in line and str(gone) in line]
        assert line.endswith(("KiB freed", "MiB freed"))
    assert any(f"resume would pick {pick / 'checkpoint-4'}" in line for line in logged)
    assert any(str(dead_pipes) in line and "21 KiB freed" in line for line in logged)
    assert any("is-live-fails" in line and "keeping" in line for line in logged)
    assert (
        store.latest_checkpoint("tiny", "sft_adapter", is_live=lambda run: run == "run-live") == pick / "checkpoint-4"
    )
    assert store.clean_leftovers(is_live, min_age_s=600, log=logged.append) == []  # idempotent


class Recorder(Reporter):
    def __init__(self):
        super().__init__()
        self.lines = []

    def log(self, message: str) -> None:
        self.lines.append(message)


def test_resume_skips_a_half_saved_newest_checkpoint(tiny_model, tmp_path):
    """A kill during a save leaves checkpoint-N without trainer_state.json: resume from checkpoint-(N-1)."""
    store = ArtifactStore(runs_dir=str(tmp_path / "runs"))
    ckpt_dir = store.checkpoint_dir("tiny", "sft_adapter", "run-killed")
    train, held = ticket_files(tmp_path)
    first = job(tmp_path, tiny_model, train, held, max_steps=4, save_steps=2)
    first.inputs.checkpoint_dir = str(ckpt_dir)
    sft.train_sft(first, Reporter())
    two, four = ckpt_dir / "checkpoint-2", ckpt_dir / "checkpoint-4"
    assert checkpoints.checkpoint_problem(two) is None and checkpoints.checkpoint_problem(four) is None
    written = {p.name for p in four.iterdir()}
    assert {"trainer_state.json", "adapter_model.safetensors", "optimizer.pt", "scheduler.pt"} <= written

    # what else a save cut short looks like, each on a copy of a real checkpoint
    for damage, expected in [
        (lambda p: (p / "trainer_state.json").write_text('{"global_st'), "unreadable"),
        (lambda p: (p / "optimizer.pt").unlink(), "optimizer"),
        (lambda p: (p / "scheduler.pt").unlink(), "scheduler"),
        (lambda p: (p / "adapter_model.safetensors").unlink(), "weights"),
        (lambda p: (p / "adapter_model.safetensors").write_bytes(b""), "empty"),
    ]:
        copy = tmp_path / "damaged" / "checkpoint-2"
        shutil.rmtree(copy.parent, ignore_errors=True)
        shutil.copytree(two, copy)
        damage(copy)
        assert expected in checkpoints.checkpoint_problem(copy)

    (four / "trainer_state.json").unlink()  # the kill: everything but the state, which the Trainer writes last
    logged = []
    assert store.latest_checkpoint("tiny", "sft_adapter", log=logged.append) == two
    assert any("checkpoint-4" in line and "trainer_state.json" in line for line in logged)
    assert trainer.last_checkpoint(ckpt_dir) == two
    assert checkpoints.last_checkpoint(ckpt_dir, log=logged.append) == two

    # the engine itself falls back when handed the broken one (it was newest when the run was launched)
    resumed = job(tmp_path, tiny_model, train, held, max_steps=4, save_steps=2)  # the same schedule
    resumed.inputs.checkpoint_dir, resumed.inputs.resume_from = str(ckpt_dir), str(four)
    (tmp_path / "out" / "progress.jsonl").unlink()
    reporter = Recorder()
    result = sft.train_sft(resumed, reporter)
    rows = [json.loads(line) for line in (tmp_path / "out" / "progress.jsonl").read_text().splitlines()]
    trained = [r["step"] for r in rows if r["elapsed_s"] is not None]  # not the history carried over
    assert result.global_step == 4 and min(trained) == 3  # continued after step 2
    assert any(f"resuming from {two}" in line for line in reporter.lines)
    assert checkpoints.checkpoint_problem(ckpt_dir / "checkpoint-4") is None

    for path in ckpt_dir.glob("checkpoint-*"):  # nothing complete to fall back to: a clear error
        (path / "trainer_state.json").unlink()
    with pytest.raises(trainer.TrainingError, match="no complete checkpoint"):
        trainer.resume_point(str(ckpt_dir / "checkpoint-6"), Reporter())
    assert store.latest_checkpoint("tiny", "sft_adapter", log=logged.append) is None
