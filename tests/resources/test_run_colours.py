"""The colours we set on runs: the tag is the one MLflow's own UI reads, base never shares merged's colour."""

from pathlib import Path

import mlflow

from dragon_dagster.resources.run_colours import BASE_COLOUR, COLOUR_TAG, PALETTE, model_colour


def test_the_installed_mlflow_ui_colours_runs_by_the_tag_we_set():
    bundle = Path(mlflow.__file__).parent / "server" / "js" / "build" / "static" / "js"
    assert any(COLOUR_TAG in f.read_text(errors="ignore") for f in bundle.glob("main.*.js")), (
        f"MLflow's UI no longer reads {COLOUR_TAG}: base and merged runs may share a colour again"
    )


def test_base_is_grey_and_a_merged_model_never_is_whatever_its_pipeline_run():
    assert model_colour("base", "run-1") == BASE_COLOUR
    merged = {model_colour("merged", f"run-{i}") for i in range(200)}
    assert BASE_COLOUR not in merged and merged <= set(PALETTE) and len(merged) > 1
    assert model_colour("merged", "run-7") == model_colour("merged", "run-7"), "a run keeps its colour"
