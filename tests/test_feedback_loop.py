"""Retraining from chat feedback against a real Dagster instance: sensor, schedule, the retraining job and
the promotion gate, on the tiny chain materialized once for the session."""

import json
from pathlib import Path

from dagster import AssetKey, AssetSelection, build_schedule_context, build_sensor_context, materialize

from dragon_dagster.assets.factory import build_pipeline_defs
from dragon_dagster.assets.automation import RANGE_TAG
from dragon_dagster.engine.feedback import FeedbackStore


def parts_and_resources(materialized):
    from dragon_dagster.resources import ArtifactStore, MLflowTracking, TrainingResource

    runs = materialized["runs"]
    parts = build_pipeline_defs(materialized["pipeline"])
    resources = {"store": ArtifactStore(runs_dir=str(runs)), "tracking": MLflowTracking(runs_dir=str(runs)),
                 "training": TrainingResource(device="cpu")}
    return parts, resources


def turns(text):
    return [{"role": "user", "content": text}]


def test_schedule_skips_then_sensor_fires_once_and_retraining_runs_end_to_end(materialized):
    parts, resources = parts_and_resources(materialized)
    instance = materialized["instance"]
    [sensor_def], [schedule_def] = parts["sensors"], parts["schedules"]
    store = FeedbackStore(resources["store"].feedback_path("tiny"))

    # no feedback yet: the schedule skips and says why
    with build_schedule_context(instance=instance, resources={"store": resources["store"]}) as context:
        tick = schedule_def.evaluate_tick(context)
    assert not tick.run_requests and "no new feedback" in tick.skip_message

    model = str(Path(materialized["outcome"]["artifacts"]["merged_model"]))
    store.record("c1", turns("Doorbell Cam does not ring the chime"), "Try turning it off.", "down", model=model)
    store.record("c1", turns("Doorbell Cam does not ring the chime"), "Re-pair the chime in Settings > Chime.", "up",
                 model=model)
    with build_sensor_context(instance=instance, resources={"store": resources["store"]}) as context:
        early = sensor_def.evaluate_tick(context)
    assert not early.run_requests and "2 new feedback records" in early.skip_message
    store.record("c2", turns("Hub Pro blinks red"), "It is fine.", "edit", model=model,
                 edited="Red means no internet: check the Ethernet cable or the Wi-Fi password.")

    with build_sensor_context(instance=instance, resources={"store": resources["store"]}) as context:
        fired = sensor_def.evaluate_tick(context)
    [request] = fired.run_requests
    assert request.tags[RANGE_TAG] == "1-3" and fired.cursor == "3"
    with build_sensor_context(instance=instance, cursor=fired.cursor, resources={"store": resources["store"]}) as c:
        again = sensor_def.evaluate_tick(c)
    assert not again.run_requests, "the same records never trigger twice"

    names = ["feedback_sft_dataset", "feedback_pairs", "feedback_sft_adapter", "feedback_dpo_adapter",
             "retrained_model", "retrained_report"]
    result = materialize(parts["assets"] + parts["asset_checks"], instance=instance, resources=resources,
                         selection=AssetSelection.assets(*[["tiny", n] for n in names]), tags=request.tags,
                         raise_on_error=False)
    steps = {s.step_key: s.status.value for s in instance.get_run_step_stats(result.run_id)}
    assert all(steps[f"tiny__{n}"] == "SUCCESS" for n in names), steps
    events = {e.asset_key.path[-1]: e.metadata for e in
              (ev.event_specific_data.materialization for ev in result.get_asset_materialization_events())}
    assert events["feedback_sft_dataset"]["rows"].value == 2  # the liked reply and the edited one
    assert events["feedback_pairs"]["rows"].value == 2        # liked vs disliked, and edited vs original
    assert "skipped" not in events["feedback_dpo_adapter"]
    adapter_manifest = json.loads((Path(events["feedback_dpo_adapter"]["artifact_dir"].value) / "manifest.json")
                                  .read_text())
    assert adapter_manifest["resolved_model"] == str(Path(model) / "model"), "retraining starts from the deployed model"
    report = json.loads((Path(events["retrained_report"]["artifact_dir"].value) / "report.json").read_text())
    assert {"base", "merged"} <= set(report)
    [gate] = [e for e in result.get_asset_check_evaluations() if e.check_name == "promotion_gate"]
    pointer = resources["store"].deployed_pointer("tiny")
    if gate.passed:  # promoted: chat and the next retraining start from the retrained model
        assert result.success and json.loads(pointer.read_text())["model_dir"].startswith(str(materialized["runs"]))
    else:  # a blocking ERROR check: the run fails and the deployed model stays the merged one
        assert not result.success and not pointer.exists() and gate.metadata["regressions"].value != "none"

    # the schedule sees the records as used now, and skips until new ones arrive
    with build_schedule_context(instance=instance, resources={"store": resources["store"]}) as context:
        assert not schedule_def.evaluate_tick(context).run_requests
    store.record("c3", turns("Smart Plug Mini lost its energy history"), "Update the app.", "up", model=model)
    with build_schedule_context(instance=instance, resources={"store": resources["store"]}) as context:
        [scheduled] = schedule_def.evaluate_tick(context).run_requests
    assert scheduled.tags[RANGE_TAG] == "4-4"
    source = instance.get_latest_materialization_event(AssetKey(["tiny", "feedback_sft_dataset"]))
    assert source.dagster_event is not None
