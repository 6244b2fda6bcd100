"""The feedback sensor while ratings keep arriving: the range it requests holds every record it counted."""

from dagster import DagsterInstance

from dragon_dagster.assets import automation
from dragon_dagster.assets.factory import build_pipeline_defs
from dragon_dagster.engine.data.feedback.sqlite import SQLiteFeedbackStore
from dragon_dagster.engine.pipeline import load
from dragon_dagster.resources import ArtifactStore
from tests.assets.test_retraining import tick
from tests.support import write_pipeline

TURNS = [{"role": "user", "content": "Where is my order?"}]


class Busy(SQLiteFeedbackStore):
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


def evaluate(sensor, instance, store, cursor=None):
    from dagster import build_sensor_context

    with build_sensor_context(instance=instance, resources={"store": store}, cursor=cursor) as context:
        return sensor.evaluate_tick(context)


def test_the_sensor_says_what_it_decided_on_the_feedback_source_when_it_changes(tiny_model, tmp_path):
    """Not only in a tick's tooltip: an observation of chat_feedback says it (and keeps its data version, the
    newest record id), once per change."""
    pipeline = load(write_pipeline(tmp_path / "defs", tiny_model))  # min_new_records: 3
    store = ArtifactStore(runs_dir=str(tmp_path / "runs"))
    records = SQLiteFeedbackStore(store.feedback_path(pipeline.name))
    for n in range(2):
        records.record(f"c{n}", TURNS, "It shipped.", "up")
    [sensor] = build_pipeline_defs(pipeline)["sensors"]
    instance = DagsterInstance.ephemeral()

    first = evaluate(sensor, instance, store)
    [seen] = first.asset_events
    assert seen.asset_key.path == [pipeline.name, "chat_feedback"]
    assert seen.description == first.skip_message
    assert "2 new feedback records" in seen.description and "waiting for 3" in seen.description
    assert seen.metadata["new_records"].value == 2 and seen.metadata["records_for_a_retraining"].value == 3
    again = evaluate(sensor, instance, store, cursor=first.cursor)
    assert again.asset_events == [] and again.skip_message == first.skip_message  # nothing changed: said once

    records.record("c2", TURNS, "It shipped.", "down")
    third = evaluate(sensor, instance, store, cursor=again.cursor)
    [request] = third.run_requests
    [seen] = third.asset_events
    assert seen.description == "retraining requested on records 1-3" == seen.metadata["retraining"].value
    # stored as the daemon stores it, the observation gives the source the data version its own observation would
    # (read as Dagster's staleness reads it)
    from dagster._core.definitions.data_version import extract_data_version_from_entry

    instance.report_runless_asset_event(seen)
    entry = instance.get_latest_data_version_record(seen.asset_key).event_log_entry
    assert extract_data_version_from_entry(entry).value == "3"
