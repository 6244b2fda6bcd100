"""Runs that group others (a Dagster run's stages, a sweep's points), on a real MLflow sqlite store."""

import pytest

from dragon_dagster.resources.tracking import MLflowTracking


@pytest.mark.timeout(120)
def test_a_pipeline_run_nests_under_its_sweep_run_made_once(tmp_path):
    """The parent is found or made before the child's lock is taken (making it takes that lock too: asking
    inside it waited forever), its id is the child's parent tag, and asking again finds both runs."""
    tracking = MLflowTracking(runs_dir=str(tmp_path / "runs"))
    made = []

    def sweep():
        made.append(1)
        return tracking.parent_run("tiny", {"sweep": "s1", "level": "sweep"}, "sweep s1", tags={}, params={})

    def point(n: int) -> str:
        key = {"dagster_run_id": f"r{n}", "level": "pipeline"}
        return tracking.parent_run("tiny", key, f"point {n}", tags={}, params={}, parent=sweep)

    first, second = point(0), point(1)
    assert point(0) == first and len(made) == 2  # found again: its parent is not asked for
    client = tracking.client()
    [sweep_run] = client.search_runs([tracking.experiment_id("tiny")], "tags.level = 'sweep'")
    for run_id in (first, second):
        assert client.get_run(run_id).data.tags["mlflow.parentRunId"] == sweep_run.info.run_id
    alone = tracking.parent_run("tiny", {"dagster_run_id": "r9", "level": "pipeline"}, "alone", tags={}, params={})
    assert "mlflow.parentRunId" not in client.get_run(alone).data.tags
