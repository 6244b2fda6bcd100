"""The feedback sensor while ratings keep arriving: the range it requests holds every record it counted."""

from dagster import DagsterInstance

from dragon_dagster.assets import automation
from dragon_dagster.assets.factory import build_pipeline_defs
from dragon_dagster.engine.data.feedback_store import FeedbackStore
from dragon_dagster.engine.pipeline import load
from dragon_dagster.resources import ArtifactStore
from tests.assets.test_retraining import tick
from tests.support import write_pipeline

TURNS = [{"role": "user", "content": "Where is my order?"}]


class Busy(FeedbackStore):
    """A real store on which one more rating lands while the sensor counts (another chat server's, say)."""

    def count(self, after_id: int = 0) -> int:
        self.record("late", TURNS, "It shipped.", "up")
        return super().count(after_id)


def test_a_rating_that_lands_between_the_sensors_reads_is_in_its_range(tiny_model, tmp_path, monkeypatch):
    pipeline = load(write_pipeline(tmp_path / "defs", tiny_model))  # min_new_records: 3
    store = ArtifactStore(runs_dir=str(tmp_path / "runs"))
    busy = Busy(store.feedback_path(pipeline.name))
    for n in range(2):
        busy.record(f"c{n}", TURNS, "It shipped.", "up")
    monkeypatch.setattr(automation, "feedback_records", lambda pipeline, store, tracking=None: busy)
    [sensor] = build_pipeline_defs(pipeline)["sensors"]
    requests, why = tick(sensor, DagsterInstance.ephemeral(), store)
    assert len(requests) == 1, why
    assert requests[0].tags[automation.RANGE_TAG] == "1-3"  # read the other way round: "1-2", with 3 counted
