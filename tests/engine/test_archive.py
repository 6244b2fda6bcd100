"""Archiving an artifact and restoring it (issue 43's Runs list): gone from the lists with every file kept, back byte
for byte, refused while its run is going or another artifact reads it."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from dragon_dagster.cli import main
from dragon_dagster.engine.archive import ArchiveError, archive, archived, restore
from dragon_dagster.engine.artifacts.directories import is_read_only
from dragon_dagster.engine.runs import list_artifacts


def tree(directory: Path) -> dict[str, tuple[str, int]]:
    """Every file under directory: its content's digest and its mode."""
    return {
        str(p.relative_to(directory)): (hashlib.sha256(p.read_bytes()).hexdigest(), os.lstat(p).st_mode)
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def one(runs: Path, stage: str) -> Path:
    [directory] = (runs / "artifacts" / "tiny" / stage).iterdir()
    return directory


def test_an_archived_artifact_leaves_the_lists_keeps_every_file_and_comes_back(materialized, tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    shutil.copytree(materialized["runs"] / "artifacts", runs / "artifacts")  # a copy: the shared chain stays
    report, sft = one(runs, "evaluation_report"), one(runs, "sft_adapter")
    before = tree(report)
    name = f"tiny/evaluation_report/{report.name}"

    # what another artifact reads stays (the merge folds the SFT adapter in), and a run still going keeps its own
    with pytest.raises(ArchiveError, match=r"is read by tiny/merged_model/.*: archive it first \(or pass --force\)"):
        archive(runs, sft)
    with pytest.raises(ArchiveError, match="still going; cancel it first"):
        archive(runs, report, is_live=lambda run_id: True)
    assert sft.exists() and report.exists()

    where = archive(runs, name, is_live=lambda run_id: False)
    assert where == runs / "archived" / name and not report.exists()
    assert "tiny/evaluation_report" not in {row["asset"] for row in list_artifacts(runs)}
    assert [row["asset"] for row in archived(runs)] == ["tiny/evaluation_report"]
    assert tree(where) == before  # every file kept, as it was

    assert restore(runs, name) == report
    assert tree(report) == before and is_read_only(report)  # back byte for byte, still read-only
    assert archived(runs) == [] and "tiny/evaluation_report" in {row["asset"] for row in list_artifacts(runs)}
    with pytest.raises(ArchiveError, match="is not an archived artifact"):
        restore(runs, name)
    with pytest.raises(ArchiveError, match="is not an artifact under"):
        archive(runs, "tiny/evaluation_report/nope")

    # the same from the command line, errors in one line
    monkeypatch.setenv("DRAGON_RUNS_DIR", str(runs))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    cli = CliRunner()
    out = cli.invoke(main, ["runs", "--archive", name])
    assert out.exit_code == 0 and f"`dragon runs --restore {name}` brings it back" in out.output, out.output
    out = cli.invoke(main, ["runs", "--archived"])
    assert out.exit_code == 0 and str(runs / "archived" / name) in out.output
    out = cli.invoke(main, ["runs", "--archive", str(sft)])
    assert out.exit_code == 1 and "is read by tiny/merged_model/" in out.output and "Traceback" not in out.output
    out = cli.invoke(main, ["runs", "--restore", name])
    assert out.exit_code == 0 and str(report) in out.output and tree(report) == before
