"""benchmarks/compare_trl.py runs the peer and this project on the same rows, in interleaved rounds."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_benchmark_runs_the_peer_and_ours_on_the_same_rows_in_interleaved_rounds(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "compare_trl.py"),
            "--only",
            "sft,grpo",
            "--rounds",
            "2",
            "--steps",
            "4",
            "--grpo-steps",
            "3",
            "--skip",
            "1",
            "--grpo-skip",
            "1",
            "--comp",
            "8",
            "--json",
            str(tmp_path / "bench.json"),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    runs = json.loads((tmp_path / "bench.json").read_text())["runs"]
    # two rounds, each side once per measurement per round, the side that goes first alternating
    assert [(r["measurement"], r["side"]) for r in runs] == [
        ("sft", "peer"), ("sft", "ours"), ("grpo", "peer"), ("grpo", "ours"),
        ("sft", "ours"), ("sft", "peer"), ("grpo", "ours"), ("grpo", "peer"),
    ]  # fmt: skip
    for run in runs:
        assert run["figure"] > 0 and run["peak_gib"] > 0
    # the same rows, model and objective on both sides: the first step's loss is the same number
    for measurement in ("sft", "grpo"):
        first = {r["side"]: r["losses"][0] for r in runs if r["measurement"] == measurement and r["tag"].endswith("-0")}
        assert first["peer"] == pytest.approx(first["ours"], rel=1e-4, abs=1e-6)
    assert "| sft: trained tokens/s |" in out.stdout and "x** | 2 |" in out.stdout
