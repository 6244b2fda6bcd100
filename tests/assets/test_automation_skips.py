"""The feedback sensor and schedule of the bundled pipeline say why they skip a tick, in the words Dagster's tick
list shows: a real instance and feedback store, no training (the retraining itself: test_retraining.py)."""

from dagster import DagsterInstance, build_schedule_context, build_sensor_context

from dragon_dagster.assets.factory import build_pipeline_defs
from dragon_dagster.assets.launch import find_pipeline
from dragon_dagster.engine.data.feedback.sqlite import SQLiteFeedbackStore
from dragon_dagster.resources import ArtifactStore


def test_the_bundled_sensor_and_schedule_skip_with_their_reason(tmp_path):
    pipeline = find_pipeline("support")
    parts = build_pipeline_defs(pipeline)
    [sensor_def], [schedule_def] = parts["sensors"], parts["schedules"]
    store = ArtifactStore(runs_dir=str(tmp_path / "runs"))
    feedback = SQLiteFeedbackStore(store.feedback_path("support"))
    with DagsterInstance.from_config(str(_home(tmp_path))) as instance:
        with build_schedule_context(instance=instance, resources={"store": store}) as context:
            nightly = schedule_def.evaluate_tick(context)
        assert not nightly.run_requests
        assert nightly.skip_message == "no new feedback since the last retraining (records up to 0)"
        for n in range(3):
            feedback.record(f"c{n}", [{"role": "user", "content": f"My hub {n} is offline"}], "Restart it.", "up")
        with build_sensor_context(instance=instance, resources={"store": store}) as context:
            tick = sensor_def.evaluate_tick(context)
        assert not tick.run_requests
        # defs.yaml's feedback.min_new_records is 20: the reason names what it has and what it waits for
        assert tick.skip_message == (
            "3 new feedback records since the last successful retraining (records up to 0); waiting for 20"
        )


def _home(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    return home
