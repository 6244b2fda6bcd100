"""Retraining from chat feedback against a real Dagster instance: sensor, schedule, the retraining job and
the promotion gate, on the tiny chain materialized once for the session; a failed retraining leaves its
records to the next tick, and bad records are skipped and counted."""

import json
import sqlite3
import uuid
from pathlib import Path

import pytest
from dagster import (
    AssetKey,
    AssetMaterialization,
    AssetSelection,
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    MetadataValue,
    build_asset_check_context,
    build_schedule_context,
    build_sensor_context,
    materialize,
)

from dragon_dagster.assets.automation import PIPELINE_TAG, RANGE_TAG, last_used_id
from dragon_dagster.assets.factory import build_pipeline_defs
from dragon_dagster.assets.promotion_gate import promotion_check
from dragon_dagster.engine.data.feedback.sqlite import SQLiteFeedbackStore
from dragon_dagster.engine.release.model_registry import CHALLENGER, CHAMPION, alias_version, version_for
from tests.support import failed_message

NAMES = [
    "feedback_sft_dataset",
    "feedback_pairs",
    "feedback_ratings",
    "feedback_prompts",
    "sft_on_feedback",
    "dpo_on_feedback",
    "kto_on_feedback",
    "feedback_reward_model",
    "rlhf_on_feedback",
    "retrained_model",
    "retrained_report",
]


def parts_and_resources(materialized):
    from dragon_dagster.resources import ArtifactStore, MLflowTracking, TrainingResource

    runs = materialized["runs"]
    parts = build_pipeline_defs(materialized["pipeline"])
    resources = {
        "store": ArtifactStore(runs_dir=str(runs)),
        "tracking": MLflowTracking(runs_dir=str(runs)),
        "training": TrainingResource(device="cpu"),
    }
    return parts, resources


def retrain_every_step(parts, instance, resources, tags):
    """The retraining job's assets and the gate, run for a requested range; every step must succeed (the gate's
    check may pass or fail). Returns (result, {asset name: materialization metadata})."""
    result = materialize(
        parts["assets"] + parts["asset_checks"],
        instance=instance,
        resources=resources,
        selection=AssetSelection.assets(*[["tiny", n] for n in NAMES]),
        tags=tags,
        raise_on_error=False,
    )
    steps = {s.step_key: s.status.value for s in instance.get_run_step_stats(result.run_id)}
    assert all(steps[f"tiny__{n}"] == "SUCCESS" for n in NAMES), steps
    events = {
        e.asset_key.path[-1]: e.metadata
        for e in (ev.event_specific_data.materialization for ev in result.get_asset_materialization_events())
    }
    return result, events


def turns(text):
    return [{"role": "user", "content": text}]


def test_schedule_skips_then_sensor_fires_once_and_retraining_runs_end_to_end(chain_copy):
    materialized = chain_copy  # it records feedback, retrains and may promote: on a copy of the chain's stores
    parts, resources = parts_and_resources(materialized)
    instance = materialized["instance"]
    [sensor_def], [schedule_def] = parts["sensors"], parts["schedules"]
    store = SQLiteFeedbackStore(resources["store"].feedback_path("tiny"))

    # no feedback yet: the schedule skips and says why
    with build_schedule_context(instance=instance, resources={"store": resources["store"]}) as context:
        tick = schedule_def.evaluate_tick(context)
    assert not tick.run_requests and "no new feedback" in tick.skip_message

    model = str(Path(materialized["outcome"]["artifacts"]["merged_model"]))
    store.record("c1", turns("Doorbell Cam does not ring the chime"), "Try turning it off.", "down", model=model)
    store.record(
        "c1", turns("Doorbell Cam does not ring the chime"), "Re-pair the chime in Settings > Chime.", "up", model=model
    )
    with build_sensor_context(instance=instance, resources={"store": resources["store"]}) as context:
        early = sensor_def.evaluate_tick(context)
    assert not early.run_requests and "2 new feedback records" in early.skip_message
    store.record(
        "c2",
        turns("Hub Pro blinks red"),
        "It is fine.",
        "edit",
        model=model,
        edited="Red means no internet: check the Ethernet cable or the Wi-Fi password.",
    )

    with build_sensor_context(instance=instance, resources={"store": resources["store"]}) as context:
        fired = sensor_def.evaluate_tick(context)
    [request] = fired.run_requests
    assert (request.tags[RANGE_TAG], request.tags[PIPELINE_TAG], request.run_key) == ("1-3", "tiny", "feedback-1-3-1")
    # the cursor only remembers what the chat_feedback source was last told (no record counts as used until a
    # retraining on it succeeded): evaluated from it, the sensor requests the same records, and says nothing new
    assert fired.cursor == "0:3:retraining requested on records 1-3" and len(fired.asset_events) == 1
    with build_sensor_context(instance=instance, resources={"store": resources["store"]}, cursor=fired.cursor) as c:
        later = sensor_def.evaluate_tick(c)
    [again] = later.run_requests
    assert again.run_key == request.run_key, "the same request: Dagster launches a run key once"
    assert later.asset_events == []

    client = resources["tracking"].client()
    champion_before = alias_version(client, "tiny", CHAMPION)
    result, events = retrain_every_step(parts, instance, resources, request.tags)
    assert events["feedback_sft_dataset"]["rows"].value == 2  # the liked reply and the edited one
    assert events["feedback_pairs"]["rows"].value == 2  # liked vs disliked, and edited vs original
    assert "skipped" not in events["dpo_on_feedback"]
    adapter_manifest = json.loads((Path(events["dpo_on_feedback"]["artifact_dir"].value) / "manifest.json").read_text())
    assert adapter_manifest["resolved_model"] == str(Path(model) / "model"), "retraining starts from the deployed model"
    report = json.loads((Path(events["retrained_report"]["artifact_dir"].value) / "report.json").read_text())
    assert {"base", "merged"} <= set(report)
    [gate] = [e for e in result.get_asset_check_evaluations() if e.check_name == "promotion_gate"]
    version = version_for(client, "tiny", events["retrained_model"]["artifact_dir"].value)
    assert alias_version(client, "tiny", CHALLENGER) == version, "the newest candidate is the challenger"
    registered = client.get_model_version("tiny", version)
    assert registered.tags["dagster_run_id"] == result.run_id and registered.tags["asset_key"] == "tiny/retrained_model"
    merge_run = client.get_run(registered.run_id)  # logged on the merge's run, nested in this Dagster run's
    assert merge_run.data.tags["upstream_mlflow_run_id"] == adapter_manifest["mlflow_run_id"]
    assert merge_run.data.tags["dagster_run_id"] == result.run_id and merge_run.data.tags["mlflow.parentRunId"]
    if gate.passed:  # promoted: chat and the next retraining start from the retrained model
        assert result.success and alias_version(client, "tiny", CHAMPION) == version
        assert gate.metadata["champion"].value == f"models:/tiny/{version}"
    else:  # a blocking ERROR check: the run fails and the champion stays what it was
        decision = gate.metadata["decision"].value
        assert not result.success and not decision.startswith("promoted")
        assert gate.metadata["regressions"].value != "none" or "not above min_gain" in decision, decision
        assert alias_version(client, "tiny", CHAMPION) == champion_before

    with build_sensor_context(instance=instance, resources={"store": resources["store"]}) as context:
        after = sensor_def.evaluate_tick(context)
    with build_schedule_context(instance=instance, resources={"store": resources["store"]}) as context:
        nightly = schedule_def.evaluate_tick(context)
    # promoted or rejected by the gate, the retraining ran to its report: the records are used, both skip
    assert not after.run_requests and "0 new feedback records" in after.skip_message
    assert not nightly.run_requests and "records up to 3" in nightly.skip_message
    store.record("c3", turns("Smart Plug Mini lost its energy history"), "Update the app.", "up", model=model)
    with build_schedule_context(instance=instance, resources={"store": resources["store"]}) as context:
        [scheduled] = schedule_def.evaluate_tick(context).run_requests
    assert scheduled.tags[RANGE_TAG] == "4-4"
    source = instance.get_latest_materialization_event(AssetKey(["tiny", "feedback_sft_dataset"]))
    assert source.dagster_event is not None


def tick(definition, instance, store_resource):
    """One evaluation of a sensor or schedule against the instance: (run requests, skip message)."""
    if hasattr(definition, "cron_schedule"):
        with build_schedule_context(instance=instance, resources={"store": store_resource}) as context:
            data = definition.evaluate_tick(context)
    else:
        with build_sensor_context(instance=instance, resources={"store": store_resource}) as context:
            data = definition.evaluate_tick(context)
    return list(data.run_requests or []), data.skip_message


def test_failed_retraining_leaves_its_records_for_the_next_tick(materialized, tmp_path):
    """A fresh instance and runs folder: retraining fails (no deployed model yet) after its datasets were
    materialized; the sensor and the schedule request the same records again under new run keys, wait while a
    run is going, back off after repeated failures, and stop once a retraining on them succeeded. Bad records
    in the range are skipped and counted, not fatal."""
    from dragon_dagster.resources import ArtifactStore, MLflowTracking, TrainingResource

    runs = tmp_path / "runs"
    parts = build_pipeline_defs(materialized["pipeline"])
    resources = {
        "store": ArtifactStore(runs_dir=str(runs)),
        "tracking": MLflowTracking(runs_dir=str(runs)),
        "training": TrainingResource(device="cpu"),
    }
    (tmp_path / "dagster_home").mkdir()
    instance = DagsterInstance.local_temp(str(tmp_path / "dagster_home"))  # schedule contexts need a stored one
    [sensor_def], [schedule_def] = parts["sensors"], parts["schedules"]
    store_resource = resources["store"]
    store = SQLiteFeedbackStore(store_resource.feedback_path("tiny"))

    store.record("c1", turns("Doorbell Cam does not ring the chime"), "Try turning it off.", "down")
    store.record("c1", turns("Doorbell Cam does not ring the chime"), "Re-pair the chime in Settings > Chime.", "up")
    store.record("c2", turns("Hub Pro blinks red"), "It is fine.", "edit", edited="Red means no internet.")
    with sqlite3.connect(store.path) as conn:  # two bad rows (first-layout data): turns not JSON, an edit without text
        conn.execute(
            "INSERT INTO feedback (conversation_id, legacy_turns, reply, verdict, created) "
            "VALUES ('bad', '[{oops', 'r', 'up', '2026')"
        )
        conn.execute(
            "INSERT INTO feedback (conversation_id, legacy_turns, reply, verdict, created) "
            """VALUES ('bad', '[{"role": "user", "content": "q"}]', 'r', 'edit', '2026')"""
        )

    def retrain(request, checks=True):
        return materialize(
            parts["assets"] + (parts["asset_checks"] if checks else []),
            instance=instance,
            resources=resources,
            selection=AssetSelection.assets(*[["tiny", n] for n in NAMES]),
            tags=request.tags,
            raise_on_error=False,
        )

    [request], _ = tick(sensor_def, instance, store_resource)
    assert request.tags[RANGE_TAG] == "1-5" and request.run_key == "feedback-1-5-1"
    failed = retrain(request)
    assert not failed.success
    steps = {s.step_key: s.status.value for s in instance.get_run_step_stats(failed.run_id)}
    assert steps["tiny__feedback_sft_dataset"] == "SUCCESS" and steps["tiny__sft_on_feedback"] == "FAILURE"
    events = {
        e.asset_key.path[-1]: e.metadata
        for e in (ev.event_specific_data.materialization for ev in failed.get_asset_materialization_events())
    }
    sft = events["feedback_sft_dataset"]
    assert sft["rows"].value == 2 and sft["records"].value == 5 and sft["skipped_records"].value == 2
    assert sft["skipped_by_reason"].value == {"turns_not_json": 1, "edit_without_text": 1}
    assert events["feedback_pairs"]["skipped_records"].value == 2 and events["feedback_pairs"]["rows"].value == 2
    manifest = json.loads((Path(sft["artifact_dir"].value) / "manifest.json").read_text())
    assert manifest["skipped"] == {"turns_not_json": 1, "edit_without_text": 1} and manifest["skipped_records"] == 2
    provenance = json.loads((Path(sft["artifact_dir"].value) / "records.json").read_text())
    assert [r["skipped"] for r in provenance] == [None, None, None, "turns_not_json", "edit_without_text"]

    # the failed run's dataset materialization does not count: both ask for the same records again
    assert last_used_id(instance, "tiny") == 0
    [retry], _ = tick(sensor_def, instance, store_resource)
    [nightly], _ = tick(schedule_def, instance, store_resource)
    assert (retry.tags[RANGE_TAG], retry.run_key) == ("1-5", "feedback-1-5-2")
    assert (nightly.tags[RANGE_TAG], nightly.run_key) == ("1-5", "scheduled-1-5-2")

    # while a retraining of the pipeline is going, neither requests another
    going = instance.add_run(
        DagsterRun(
            job_name="tiny_retrain_from_feedback",
            run_id=str(uuid.uuid4()),
            status=DagsterRunStatus.STARTED,
            tags=dict(retry.tags),
        )
    )
    for definition in (sensor_def, schedule_def):
        requests, why = tick(definition, instance, store_resource)
        assert not requests and going.run_id in why and "has not finished" in why
    instance.delete_run(going.run_id)

    # after MAX_FAILED_ATTEMPTS failures the sensor waits for min_new_records more records; the schedule still tries
    assert not retrain(retry).success and not retrain(nightly).success
    requests, why = tick(sensor_def, instance, store_resource)
    assert not requests and "3 retraining runs on the records after 0 failed" in why
    [nightly], _ = tick(schedule_def, instance, store_resource)
    assert nightly.run_key == "scheduled-1-5-4"
    for i in range(3):
        store.record("c3", turns(f"Smart Plug Mini question {i}"), f"Answer {i}.", "up")
    [request], _ = tick(sensor_def, instance, store_resource)
    assert (request.tags[RANGE_TAG], request.run_key) == ("1-8", "feedback-1-8-1")

    # a successful retraining (deployed model present; the gate left out so the outcome does not depend on it)
    assert materialize(
        parts["assets"],
        instance=instance,
        resources=resources,
        selection=AssetSelection.assets(["tiny", "tickets"], ["tiny", "sft_dataset"]),
    ).success
    tracking = resources["tracking"]
    version = tracking.register_model(
        "tiny",
        Path(materialized["outcome"]["artifacts"]["merged_model"]) / "model",
        None,
        {"note": "registered by hand"},
    )
    assert tracking.promote("tiny", version, "by hand") is None  # the first champion of this store
    done = retrain(request, checks=False)
    assert done.success
    assert last_used_id(instance, "tiny") == 8
    requests, why = tick(sensor_def, instance, store_resource)
    assert not requests and "0 new feedback records" in why and "records up to 8" in why
    requests, why = tick(schedule_def, instance, store_resource)
    assert not requests and "no new feedback since the last retraining (records up to 8)" in why
    store.record("c4", turns("Camera offline"), "Power-cycle it.", "up")
    [nightly], _ = tick(schedule_def, instance, store_resource)
    assert (nightly.tags[RANGE_TAG], nightly.run_key) == ("9-9", "scheduled-9-9-1")


def test_promotion_gate_moves_the_champion_only_when_the_retraining_is_better(materialized, tmp_path):
    """Registered versions in a fresh MLflow store: the gate on a report with a gain on the held-out feedback and
    no task regression makes its model the champion; the gate on one without a gain, without held-out feedback,
    worse on the task, or started from a model that is no longer the champion fails and leaves the champion where
    it was, saying which figure decided."""
    from dragon_dagster.engine.artifacts.manifest import MergedManifest, MergeResult, ReportManifest, write_manifest
    from dragon_dagster.engine.stages.evaluate.result import ReportResult
    from dragon_dagster.resources import ArtifactStore, MLflowTracking

    runs = tmp_path / "runs"
    tracking, store = MLflowTracking(runs_dir=str(runs)), ArtifactStore(runs_dir=str(runs))
    model = Path(materialized["outcome"]["artifacts"]["merged_model"]) / "model"
    instance = DagsterInstance.ephemeral()
    report_key = AssetKey(["tiny", "retrained_report"])
    gate = promotion_check(materialized["pipeline"], report_key)
    merged = {}

    def register(name: str) -> str:
        merged[name] = tmp_path / f"merged-{name}"
        merged[name].mkdir()
        return tracking.register_model("tiny", model, None, {"artifact_dir": str(merged[name])})

    def gate_on(name: str, retrained_loss: float, started_from: str | None = None, gain: float | None = 0.05):
        info = MergeResult(model_dir=str(model), size_mb=1.0, parameters=1, sample_prompt="q", sample_reply="a")
        write_manifest(  # no starting model named (""): nothing to compare the champion with
            merged[name],
            MergedManifest(
                base_model=str(model), resolved_model=started_from or "", adapters=[], info=info, settings={}
            ),
        )
        report_dir = tmp_path / f"report-{name}-{uuid.uuid4().hex[:6]}"
        report_dir.mkdir()
        base = {"eval_loss": 1.0, "metrics": {"token_f1": 0.5}}
        held = {"rated_replies": 0 if gain is None else 4, "liked": 2, "disliked": 2, "pairs": 0, "prompts": 4}
        feedback = {
            "held_out": held,
            "reward": None if gain is None else {"start": 0.0, "retrained": gain, "gain": gain},
        }
        report = ReportResult(
            task="chat",
            held_out=True,
            rows=4,
            merged_not_worse=None,
            base=base,
            merged={"eval_loss": retrained_loss, "metrics": {"token_f1": 0.5}},
            feedback=feedback,
        )
        (report_dir / "report.json").write_text(report.model_dump_json())
        write_manifest(report_dir, ReportManifest(merged=str(merged[name]), dataset="sft_dataset", settings={}))
        instance.report_runless_asset_event(
            AssetMaterialization(report_key, metadata={"artifact_dir": MetadataValue.path(str(report_dir))})
        )
        return gate(build_asset_check_context(instance=instance, resources={"tracking": tracking, "store": store}))

    assert (register("a"), register("b"), register("c")) == ("1", "2", "3")
    client = tracking.client()
    assert alias_version(client, "tiny", CHALLENGER) == "3"
    assert alias_version(client, "tiny", CHAMPION) is None and tracking.champion_dir("tiny") is None

    flat = gate_on("a", 0.9, gain=0.0)  # better task loss, but it learned nothing of what people liked
    assert not flat.passed and flat.metadata["regressions"].value == "none"
    assert flat.metadata["decision"].value == "reward gain 0 is not above min_gain 0 on the held-out feedback"
    assert flat.metadata["feedback/reward_gain"].value == 0.0 and flat.metadata["gate_metric"].value == "reward"
    unmeasured = gate_on("a", 0.9, gain=None)
    assert (
        not unmeasured.passed and "no held-out feedback to measure reward on" in unmeasured.metadata["decision"].value
    )
    assert alias_version(client, "tiny", CHAMPION) is None, "a retraining that is not better is not promoted"

    passed = gate_on("a", 0.9)
    assert passed.passed and passed.metadata["feedback/reward_gain"].value == 0.05
    assert passed.metadata["decision"].value == "promoted: reward gain above 0.0 and no task regression"
    assert alias_version(client, "tiny", CHAMPION) == "1"
    champion_dir = tracking.champion_dir("tiny")
    assert (champion_dir / "config.json").exists()
    rejected = gate_on("b", 1.5, started_from=str(champion_dir))  # worse held-out loss than where it started
    assert not rejected.passed and rejected.metadata["regressions"].value == "eval_loss"
    assert rejected.metadata["decision"].value == "eval_loss worse than the starting model beyond its task_tolerance"
    assert alias_version(client, "tiny", CHAMPION) == "1", "a rejected retraining leaves the champion unchanged"
    assert client.get_model_version("tiny", "1").tags["promoted"].endswith("promotion_gate passed")

    # better, but it started from a model that is no longer the champion (rolled back meanwhile, say)
    moved = gate_on("c", 0.5, started_from=str(tmp_path / "an-older-champion" / "model"))
    assert not moved.passed and "champion moved during the retraining" in moved.metadata["regressions"].value
    assert alias_version(client, "tiny", CHAMPION) == "1"
    assert gate_on("c", 0.5, started_from=str(champion_dir)).passed  # from the live champion: promoted
    assert alias_version(client, "tiny", CHAMPION) == "3"


def test_retraining_on_unpaired_ratings_runs_kto_and_skips_what_has_no_records(materialized, tmp_path):
    """Only thumbs up and down on different prompts (no pair anywhere): SFT trains on the liked replies, DPO is
    skipped, KTO trains on every rating; then only thumbs down: SFT and DPO are skipped and KTO starts from the
    deployed model itself. The run's tags and the report say which objective ran on how many records, and the
    gate shows the held-out feedback figures that decided it."""
    from dragon_dagster.resources import ArtifactStore, MLflowTracking, TrainingResource

    runs = tmp_path / "runs"
    parts = build_pipeline_defs(materialized["pipeline"])
    resources = {
        "store": ArtifactStore(runs_dir=str(runs)),
        "tracking": MLflowTracking(runs_dir=str(runs)),
        "training": TrainingResource(device="cpu"),
    }
    instance = DagsterInstance.ephemeral()
    tracking, store_resource = resources["tracking"], resources["store"]
    deployed = Path(materialized["outcome"]["artifacts"]["merged_model"]) / "model"
    tracking.promote("tiny", tracking.register_model("tiny", deployed, None, {"note": "by hand"}), "by hand")
    assert materialize(
        parts["assets"],
        instance=instance,
        resources=resources,
        selection=AssetSelection.assets(["tiny", "tickets"], ["tiny", "sft_dataset"]),
    ).success
    store = SQLiteFeedbackStore(store_resource.feedback_path("tiny"))
    subjects = [
        "Hub Pro blinks red",
        "Doorbell Cam lags",
        "Smart Plug Mini offline",
        "Thermostat too warm",
        "Camera will not pair",
        "Chime is silent",
        "Light strip flickers",
        "Lock jams",
    ]
    for i, subject in enumerate(subjects):
        liked = i % 2 == 0
        store.record(f"u{i}", turns(subject), f"Reply {i} about {subject}.", "up" if liked else "down")
    [sensor_def] = parts["sensors"]

    def retrain():
        [request], _ = tick(sensor_def, instance, store_resource)
        result, events = retrain_every_step(parts, instance, resources, request.tags)
        report_dir = Path(events["retrained_report"]["artifact_dir"].value)
        [gate] = [e for e in result.get_asset_check_evaluations() if e.check_name == "promotion_gate"]
        return (
            instance.get_run_by_id(result.run_id).tags,
            events,
            json.loads((report_dir / "report.json").read_text()),
            gate,
        )

    tags, events, report, gate = retrain()
    ratings = json.loads((Path(events["feedback_ratings"]["artifact_dir"].value) / "manifest.json").read_text())
    held_out = ratings["eval_rows"]
    assert held_out == 2 and ratings["train_rows"] == 6, "2 of 8 conversations held out for the gate"
    assert events["feedback_pairs"]["rows"].value == 0
    assert tags["dragon/feedback_dpo"] == "skipped: no pairs"
    assert tags["dragon/feedback_kto"] == "6 rows from 6 records"
    liked_in_train = sum(
        1 for r in store.records() if r["verdict"] == "up" and r["conversation_id"] in {f"u{i}" for i in range(8)}
    ) - sum(
        1
        for line in (Path(events["feedback_ratings"]["artifact_dir"].value) / "eval.jsonl").read_text().splitlines()
        if json.loads(line)["label"]
    )
    assert tags["dragon/feedback_sft"] == f"{liked_in_train} rows from {liked_in_train} records"
    kto = json.loads((Path(events["kto_on_feedback"]["artifact_dir"].value) / "manifest.json").read_text())
    sft = json.loads((Path(events["sft_on_feedback"]["artifact_dir"].value) / "manifest.json").read_text())
    assert kto["method"] == "kto" and kto["chain"] == sft["chain"] + [str(Path(kto["chain"][-1]))]
    assert events["dpo_on_feedback"]["skipped"].value == "no pairs"
    run = tracking.client().get_run(kto["mlflow_run_id"])
    assert (run.data.tags["objective"], run.data.tags["feedback_records"]) == ("kto", "6")
    by_objective = {o["objective"]: o for o in report["objectives"]}
    assert [by_objective[o]["ran"] for o in ("sft", "dpo", "kto", "rlhf")] == [True, False, True, False]
    assert by_objective["rlhf"]["skipped"] == "off (feedback.objectives)"
    assert by_objective["dpo"]["skipped"] == "no pairs" and by_objective["kto"]["records"] == 6
    assert report["feedback"]["held_out"]["rated_replies"] == 2 and report["feedback"]["reward"] is not None
    liked_share = report["feedback"]["liked_share"]  # the pipeline's taste: fewer than 3 words
    assert 0 <= liked_share["start"] <= 1 and liked_share["gain"] == liked_share["retrained"] - liked_share["start"]
    assert (Path(events["retrained_report"]["artifact_dir"].value) / "rewards" / "taste.py").exists(), (
        "the taste file travels with the report"
    )
    assert (
        "## Retraining from feedback"
        in (Path(events["retrained_report"]["artifact_dir"].value) / "report.md").read_text()
    )
    figures = report["feedback"]["reward"]
    assert gate.metadata["feedback/reward_gain"].value == pytest.approx(figures["gain"])
    assert gate.passed == (figures["gain"] > 0 and gate.metadata["regressions"].value == "none")

    for i, subject in enumerate(subjects):  # only thumbs down now: nothing for SFT or DPO
        store.record(f"d{i}", turns(f"{subject} again"), f"Whatever {i}.", "down")
    start = tracking.live_model("tiny", runs, "merged_model")
    tags, events, report, gate = retrain()
    assert tags["dragon/feedback_sft"] == "skipped: no liked or edited replies"
    assert tags["dragon/feedback_dpo"] == "skipped: no pairs" and tags["dragon/feedback_kto"].startswith("6 rows")
    kto = json.loads((Path(events["kto_on_feedback"]["artifact_dir"].value) / "manifest.json").read_text())
    assert kto["resolved_model"] == str(start) and len(kto["chain"]) == 1, "KTO starts from the deployed model"
    assert [o["ran"] for o in report["objectives"]] == [False, False, True, False]


def test_feedback_from_one_conversation_fails_before_training(materialized, tmp_path):
    """The gate asks for a gain on held-out conversations: a range that is one conversation fails at its
    datasets, naming why, instead of after a whole retraining the gate could only refuse."""
    from dragon_dagster.resources import ArtifactStore, MLflowTracking, TrainingResource

    parts = build_pipeline_defs(materialized["pipeline"])
    store_resource = ArtifactStore(runs_dir=str(tmp_path / "runs"))
    resources = {
        "store": store_resource,
        "tracking": MLflowTracking(runs_dir=str(tmp_path / "runs")),
        "training": TrainingResource(device="cpu"),
    }
    store = SQLiteFeedbackStore(store_resource.feedback_path("tiny"))
    store.record("one", turns("Hub Pro blinks red"), "It is fine.", "down")
    store.record(
        "one",
        turns("Hub Pro blinks red")
        + [{"role": "assistant", "content": "It is fine."}, {"role": "user", "content": "Really?"}],
        "Check the cable.",
        "up",
    )
    instance = DagsterInstance.ephemeral()
    result = materialize(
        parts["assets"],
        instance=instance,
        resources=resources,
        selection=AssetSelection.assets(["tiny", "feedback_ratings"]),
        raise_on_error=False,
        tags={RANGE_TAG: "1-2", PIPELINE_TAG: "tiny"},
    )
    assert not result.success
    message = failed_message(instance, result.run_id)
    assert "all in one conversation: none can be held out for the promotion gate" in message
    assert "gate.min_gain: null" in message
