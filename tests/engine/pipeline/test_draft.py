"""A pipeline drafted from a file nobody bundled (the studio's core): mapped by template, previewed with the figures
the dataset checks use, written as a normal component that loads and that `dg check yaml` passes; each bad mapping
named in the stage models' words, with nothing written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from dragon_dagster.engine.pipeline import load
from dragon_dagster.engine.pipeline.draft import MAX_BYTES, DraftError, Recipe, draft, write
from tests.support import user_project

BIN = Path(sys.executable).parent


def table(rows: int = 40, **columns) -> pd.DataFrame:
    data = {
        "device": [f"Lamp {i % 8}" for i in range(rows)],
        "issue": [f"flickers after update {i}" for i in range(rows)],
        "fix": [f"Roll back firmware {i} in Settings > Device." for i in range(rows)],
    }
    data.update(columns)
    return pd.DataFrame(data)


def test_a_csv_mapped_by_template_becomes_a_component_that_loads_and_checks(tmp_path, tiny_model):
    table().to_csv(tmp_path / "lamps.csv", index=False)
    made = draft(
        "lamps",
        str(tiny_model),
        tmp_path / "lamps.csv",
        "{device}: {issue}",
        "fix",
        system="You fix lamps.",
        recipe=Recipe(max_steps=3, lora_rank=4),
    )
    assert made.figures["train_rows"] + made.figures["eval_rows"] == 40 and made.figures["eval_rows"] >= 1
    assert made.figures["prompt_overlap"] == 0.0 and made.figures["empty_replies"] == 0
    assert made.preview[0]["prompt"].startswith("Lamp ") and ": flickers after update" in made.preview[0]["prompt"]
    assert made.preview[0]["system"] == "You fix lamps." and made.preview[0]["response"].startswith("Roll back")
    assert made.command().startswith("dg launch --job lamps_pipeline")

    project = tmp_path / "project"
    defs = user_project(project)
    path = write(made, defs)
    assert (
        path == defs / "lamps" / "defs.yaml"
        and (defs / "lamps" / "lamps.csv").read_bytes() == (tmp_path / "lamps.csv").read_bytes()
    )
    assert path.read_text().startswith("type: dragon_dagster.PostTrainingPipeline\nattributes:\n  name: lamps\n")
    pipeline = load(path)  # what a run loads: the data file beside it, the settings as chosen
    assert [s.name for s in pipeline.stages] == ["sft_dataset", "sft_adapter", "merged_model", "evaluation_report"]
    assert pipeline.stage("sft_adapter").args.max_steps == 3 and pipeline.stage("sft_adapter").lora.r == 4
    checked = subprocess.run(
        [str(BIN / "dg"), "check", "yaml"], cwd=project, capture_output=True, text=True, timeout=300
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    with pytest.raises(DraftError, match="exists already: choose another name"):
        write(made, defs)


@pytest.mark.parametrize(
    ("prompt", "response", "frame", "problem"),
    [
        ("{device}: {issue}", "answer", table(), "answer"),  # a missing column, named
        ("{device}: {isue}", "fix", table(), "isue"),  # a template naming an unknown column
        ("{device}: {issue}", "fix", table(fix=[""] * 40), "empty reply"),  # an empty response column
        ("{device}", "fix", table(fix=[f"Reset it {i % 3}." for i in range(40)]), "held-out rows have a prompt"),
    ],
)
def test_a_bad_mapping_is_named_and_nothing_is_written(tmp_path, tiny_model, prompt, response, frame, problem):
    frame.to_csv(tmp_path / "lamps.csv", index=False)
    with pytest.raises(DraftError, match=problem):
        made = draft("lamps", str(tiny_model), tmp_path / "lamps.csv", prompt, response)
        write(made, tmp_path / "defs")
    assert not (tmp_path / "defs" / "lamps").exists()


def test_a_file_over_the_limit_or_of_an_unknown_kind_is_refused(tmp_path, tiny_model):
    big = tmp_path / "big.csv"
    with big.open("wb") as f:
        f.truncate(MAX_BYTES + 1)
    with pytest.raises(DraftError, match=f"up to {MAX_BYTES / 1e6:.0f} MB"):
        draft("big", str(tiny_model), big, "{a}", "b")
    (tmp_path / "notes.txt").write_text("a,b\n1,2\n")
    with pytest.raises(DraftError, match=r"CSV, JSONL, JSON or Parquet"):
        draft("notes", str(tiny_model), tmp_path / "notes.txt", "{a}", "b")
    with pytest.raises(DraftError, match="lower-case letters"):
        draft("My Pipeline", str(tiny_model), tmp_path / "notes.txt", "{a}", "b")
