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
from dragon_dagster.engine.pipeline.draft import (
    MAX_BYTES,
    DraftError,
    Mapping,
    Recipe,
    draft,
    fill,
    plain_rewards,
    recipes,
    render,
    write,
)
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
        Mapping("{device}: {issue}", "fix", system="You fix lamps."),
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
        # three long replies shared across devices: an answer that identifies a row leaks (a short one would not)
        (
            "{device}",
            "fix",
            table(fix=[f"Hold the reset button on the back for {i % 3 + 5} seconds." for i in range(40)]),
            "held-out rows have a prompt",
        ),
    ],
)
def test_a_bad_mapping_is_named_and_nothing_is_written(tmp_path, tiny_model, prompt, response, frame, problem):
    frame.to_csv(tmp_path / "lamps.csv", index=False)
    with pytest.raises(DraftError, match=problem):
        made = draft("lamps", str(tiny_model), tmp_path / "lamps.csv", Mapping(prompt, response))
        write(made, tmp_path / "defs")
    assert not (tmp_path / "defs" / "lamps").exists()


def test_a_file_over_the_limit_or_of_an_unknown_kind_is_refused(tmp_path, tiny_model):
    big = tmp_path / "big.csv"
    with big.open("wb") as f:
        f.truncate(MAX_BYTES + 1)
    with pytest.raises(DraftError, match=f"up to {MAX_BYTES / 1e6:.0f} MB"):
        draft("big", str(tiny_model), big, Mapping("{a}", "b"))
    (tmp_path / "notes.txt").write_text("a,b\n1,2\n")
    with pytest.raises(DraftError, match=r"CSV, JSONL, JSON or Parquet"):
        draft("notes", str(tiny_model), tmp_path / "notes.txt", Mapping("{a}", "b"))
    with pytest.raises(DraftError, match="lower-case letters"):
        draft("My Pipeline", str(tiny_model), tmp_path / "notes.txt", Mapping("{a}", "b"))


@pytest.mark.parametrize("recipe", sorted(recipes()))
def test_every_recipe_drafts_a_pipeline_that_loads_with_the_settings_chosen(tmp_path, tiny_model, recipe):
    table(worse=[f"No idea {i}." for i in range(40)]).to_csv(tmp_path / "lamps.csv", index=False)
    chosen = Recipe(stages=recipe, max_steps=5, tune_steps=3, beta=0.2, rewards=["contains", "exact"], lora_rank=8)
    made = draft(
        "lamps", str(tiny_model), tmp_path / "lamps.csv", Mapping("{device}: {issue}", "fix", None, "worse"), chosen
    )
    (tmp_path / "defs").mkdir()
    pipeline = load(write(made, tmp_path / "defs"))
    roles = [pipeline.role_of(s) for s in pipeline.stages]
    assert roles[:2] == ["dataset", "training"] and "merge" in roles and "evaluate" in roles
    training = [s for s in pipeline.stages if pipeline.role_of(s) == "training"]
    assert training[0].args.max_steps == 5 and all(s.lora.r == 8 for s in training)
    for later in training[1:]:  # DPO or GRPO: the tune steps, the beta, GRPO's rewards by type
        assert later.args.max_steps == 3 and later.beta == 0.2
        if hasattr(later, "rewards"):
            assert [r.type for r in later.rewards] == ["contains", "exact"]
    if recipe == "sft_dpo_pairs":  # the file's pairs: chosen is the response column, rejected the one named
        pairs = next(s for s in pipeline.stages if getattr(s, "rejected", None))
        assert (pairs.chosen, pairs.rejected) == ("fix", "worse")


def test_conversations_are_read_in_their_layout_and_previewed_through_the_chat_template(tmp_path, tiny_model):
    rows = [
        {"conversations": [{"from": "human", "value": f"Lamp {i} blinks."}, {"from": "gpt", "value": f"Reset {i}."}]}
        for i in range(30)
    ]
    pd.DataFrame(rows).to_json(tmp_path / "chats.jsonl", orient="records", lines=True)
    made = draft("chats", str(tiny_model), tmp_path / "chats.jsonl", Mapping(layout="auto"))  # detected: sharegpt
    assert (made.preview[0]["prompt"], made.preview[0]["response"]) == ("Lamp 0 blinks.", "Reset 0.")
    assert "prompt" not in made.attributes["stages"][0] and made.attributes["stages"][0]["layout"] == "auto"
    rendered = render(str(tiny_model), made)[0]
    assert "Lamp 0 blinks." in rendered and rendered.index("Lamp 0 blinks.") < rendered.index("Reset 0.")
    with pytest.raises(DraftError, match=r"alpaca layout needs column\(s\) \[.instruction., .output.\]"):
        draft("chats", str(tiny_model), tmp_path / "chats.jsonl", Mapping(layout="alpaca"))


def test_recipe_slots_fill_in_and_an_empty_one_leaves_the_kinds_default():
    stages = [{"name": "a", "kind": "sft", "beta": "$beta", "args": "$sft_args"}]
    assert fill(stages, {"beta": None, "sft_args": {"max_steps": 2}}) == [
        {"name": "a", "kind": "sft", "args": {"max_steps": 2}}
    ]
    with pytest.raises(KeyError, match=r"\$nope"):
        fill({"x": "$nope"}, {"beta": 1})
    assert {"exact", "contains", "numeric"} <= set(plain_rewards()) and "regex" not in plain_rewards()
