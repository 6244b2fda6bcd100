"""The studio's run view tells what Dagster recorded (issue 58): a rerun that reused every stage says so, with the
run that made them, and links to no page that is not served; Run with unsaved edits says what differs and starts
nothing until the person chooses. (The cancel: test_studio.py's cancel test; the page itself: its browser test.)"""

from __future__ import annotations

from pathlib import Path

from graphql import parse, validate

from dragon_dagster.engine.pipeline import load
from dragon_dagster.studio import Studio
from dragon_dagster.studio.launch import ENDED, LOCATIONS, REPOSITORIES, RUN
from dragon_dagster.studio.run_view import replace_saved, unsaved
from tests.support import free_port, wait_until
from tests.test_studio import lamps, studio_values


def test_a_rerun_that_reused_every_stage_says_so_with_the_run_they_came_from(chain_copy, tiny_model):
    """The tiny chain run again as it was (in a process of the studio: no webserver answers), with no MLflow UI
    answering either: every stage reads REUSED, made by the first run, the run's line says nothing was trained,
    and it links nowhere."""
    from dragon_dagster.resources import ArtifactStore, MLflowTracking, TrainingResource

    runs, nowhere = chain_copy["runs"], f"http://127.0.0.1:{free_port()}"
    resources = {
        "store": ArtifactStore(runs_dir=str(runs)),
        "tracking": MLflowTracking(runs_dir=str(runs), ui_url=nowhere),
        "training": TrainingResource(device="cpu"),
    }
    defs = Path(chain_copy["pipeline"].source_file).parents[1]  # defs/tiny/defs.yaml
    studio = Studio(defs, runs, str(tiny_model), resources, chain_copy["instance"], dagster_url=nowhere)
    assert "a process of the studio" in studio.launch("tiny")
    launched = studio.runs["tiny"].launched
    wait_until(lambda: launched.status() in ENDED, 180, "the rerun to end")
    table, _, status = studio.follow("tiny")

    first = chain_copy["outcome"]["run_id"]
    made = {row["asset"] for row in chain_copy["outcome"]["stages"]}
    stages = table[table["stage"].isin(made)]
    assert len(stages) == len(made)  # every stage of the first run, each one
    assert set(stages["status"]) == {"REUSED"} and set(stages["note"]) == {f"made by run {first}"}
    checks = table[~table["stage"].isin(made)]  # the asset checks, run again on what was reused
    assert len(checks) and all(note.startswith("a check of ") for note in checks["note"]), checks
    assert "tiny/sft_dataset_held_out_not_leaking" in set(checks["stage"])
    assert status.startswith("**SUCCESS, nothing trained**") and f"`{first}`" in status, status
    assert f"Dagster run `{launched.run_id}`" in status and launched.run_id != first
    assert "](" not in status and "`dg dev`" in status and f"no MLflow UI answers at `{nowhere}`" in status


def test_run_with_unsaved_edits_says_what_differs_and_starts_nothing(tmp_path, tiny_model):
    data = lamps(tmp_path / "lamps.csv")
    defs = tmp_path / "defs"
    defs.mkdir()
    studio = Studio(defs, tmp_path / "runs", str(tiny_model))
    assert studio.save(*studio_values(data, steps=3))[1].startswith("Wrote")
    saved = defs / "lamps" / "defs.yaml"
    before = saved.read_text()

    edited = studio_values(data, steps=5, rewards=["contains"])
    note, offer = studio.run(*edited)
    assert note.startswith("**Not saved:**") and "stages.sft_adapter.args.max_steps" in note, note
    assert "*Save and run*" in note and offer["visible"] is True
    assert studio.runs == {} and saved.read_text() == before  # nothing started, nothing written

    (tmp_path / "other").mkdir()
    other = lamps(tmp_path / "other" / "lamps.csv", rows=41)  # the same name, other rows
    assert unsaved(studio._draft(*studio_values(other, steps=3)), saved) == ["the data file (lamps.csv)"]
    assert unsaved(studio._draft(*studio_values(data, steps=3)), saved) == []  # the form as saved: Run runs it

    note, offer = studio.run(*studio_values(data, prompt="{device}: {isue}"))  # a form that cannot be saved
    assert "The form has a problem" in note and "['isue']" in note and offer["visible"] is True
    assert studio.runs == {}

    replace_saved(studio._draft(*edited), defs)  # what *Save and run* writes before it runs
    assert load(saved).stage("sft_adapter").args.max_steps == 5
    assert unsaved(studio._draft(*edited), saved) == [] and sorted(p.name for p in defs.iterdir()) == ["lamps"]


def test_the_studio_asks_the_webserver_what_its_schema_has():
    """The GraphQL the studio sends is valid for the installed Dagster (a field renamed there fails here, not in a
    person's studio)."""
    from dagster_graphql.schema import create_schema

    schema = create_schema().graphql_schema
    for query in (LOCATIONS, REPOSITORIES, RUN):
        assert validate(schema, parse(query)) == []
