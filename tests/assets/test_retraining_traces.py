"""Traces as a feedback source: an assistant that is not this project's chat, traced with the MLflow API alone to a
real `mlflow server` (the session's `mlflow_server`), with human assessments; `feedback.source.mlflow_experiment`
makes its traces the records the retraining reads, with the same record-range accounting as the store."""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import mlflow
import pytest
from dagster import AssetSelection, DagsterInstance, build_sensor_context, materialize
from mlflow.entities import AssessmentSource, SpanType
from mlflow.entities.trace_location import MlflowExperimentLocation
from mlflow.tracking._tracking_service import utils as tracking_utils

from dragon_dagster.assets.automation import PIPELINE_TAG, RANGE_TAG
from dragon_dagster.assets.factory import build_pipeline_defs
from dragon_dagster.engine.data.trace_feedback import TraceFeedback
from dragon_dagster.engine.pipeline import load
from dragon_dagster.engine.pipeline.retraining import FeedbackSource
from tests.support import write_pipeline

pytestmark = pytest.mark.slow  # a real mlflow server (about a minute to start on 2 cores), Dagster runs

CHIME = "Doorbell Cam does not ring the chime"
HUB = "Hub Pro blinks red"
PLUG = "Smart Plug Mini lost its energy history"
FIXED = "Red means no internet: check the Ethernet cable or the Wi-Fi password."


@pytest.fixture()
def tracing_to(mlflow_server, monkeypatch):
    """The fluent tracing API pointed at the server for this test only: the module's URI is patched (and put back
    by monkeypatch), never set with mlflow.set_tracking_uri, and the exporter re-made before and after."""
    mlflow.flush_trace_async_logging()
    mlflow.tracing.reset()
    monkeypatch.setattr(tracking_utils, "_tracking_uri", mlflow_server["url"])
    yield mlflow_server["url"]
    mlflow.flush_trace_async_logging()
    mlflow.tracing.reset()


def assistant_turn(experiment_id: str, session: str, question: str, reply: str) -> str:
    """What any traced assistant writes: a CHAT_MODEL span with OpenAI-style messages in and a completion out."""
    with mlflow.start_span(
        "answer", span_type=SpanType.CHAT_MODEL, trace_destination=MlflowExperimentLocation(experiment_id)
    ) as span:
        span.set_inputs({"messages": [{"role": "user", "content": question}]})
        mlflow.update_current_trace(metadata={"mlflow.trace.session": session, "mlflow.trace.user": "rita"})
        span.set_outputs({"choices": [{"message": {"role": "assistant", "content": reply}}]})
        trace_id = span.trace_id
    mlflow.flush_trace_async_logging()
    return trace_id


def thumbs(trace_id: str, up: bool, source_type: str = "HUMAN") -> None:
    mlflow.log_feedback(
        trace_id=trace_id, name="thumbs", value=up, source=AssessmentSource(source_type=source_type, source_id="rita")
    )


def traced_assistant(url: str) -> tuple[str, dict]:
    """An experiment of traces with human ratings and an edit (and what is not feedback): (its name, trace ids)."""
    name = f"support-assistant-{uuid.uuid4().hex[:8]}"
    experiment_id = mlflow.MlflowClient(url).create_experiment(name)
    ids = {
        "down": assistant_turn(experiment_id, "s1", CHIME, "Try turning it off."),
        "up": assistant_turn(experiment_id, "s1", CHIME, "Re-pair the chime in Settings > Chime."),
        "edit": assistant_turn(experiment_id, "s2", HUB, "It is fine."),
        "plug": assistant_turn(experiment_id, "s3", PLUG, "Update the app."),
        "judged": assistant_turn(experiment_id, "s4", "Is the camera waterproof?", "Yes, IP65."),
        "unrated": assistant_turn(experiment_id, "s5", "Hello", "Hi!"),
    }
    thumbs(ids["down"], False)
    thumbs(ids["up"], True)
    mlflow.log_expectation(
        trace_id=ids["edit"],
        name="edited_reply",
        value=FIXED,
        source=AssessmentSource(source_type="HUMAN", source_id="rita"),
    )
    thumbs(ids["plug"], True)
    thumbs(ids["judged"], True, source_type="LLM_JUDGE")  # a judge's opinion is not human feedback
    return name, ids


def test_an_experiment_s_traces_are_the_records_retraining_reads(tracing_to, tiny_model, tmp_path):
    from dragon_dagster.resources import ArtifactStore, MLflowTracking, TrainingResource

    experiment, ids = traced_assistant(tracing_to)
    source = TraceFeedback(tracing_to, experiment)
    records = source.records()
    assert [r["trace_id"] for r in records] == [ids["down"], ids["up"], ids["edit"], ids["plug"]]
    assert [r["verdict"] for r in records] == ["down", "up", "edit", "up"]
    assert [r["id"] for r in records] == sorted({r["id"] for r in records}), "ids increase, one per record"
    assert records[2]["edited"] == FIXED and records[2]["reply"] == "It is fine."
    assert records[0]["turns"] == [{"role": "user", "content": CHIME}] and records[0]["conversation_id"] == "s1"
    assert source.max_id() == records[-1]["id"] and source.count(after_id=records[1]["id"]) == 2
    assert source.records(after_id=records[0]["id"], up_to_id=records[2]["id"]) == records[1:3]

    loaded = load(write_pipeline(tmp_path / "defs", tiny_model))
    feedback = loaded.feedback.model_copy(
        update={"source": FeedbackSource(mlflow_experiment=experiment, tracking_uri=tracing_to)}
    )
    pipeline = loaded.model_copy(update={"feedback": feedback})
    parts = build_pipeline_defs(pipeline)
    runs = tmp_path / "runs"
    resources = {
        "store": ArtifactStore(runs_dir=str(runs)),
        "tracking": MLflowTracking(runs_dir=str(runs)),
        "training": TrainingResource(device="cpu"),
    }
    instance = DagsterInstance.ephemeral()
    [sensor_def] = parts["sensors"]
    with build_sensor_context(instance=instance, resources={"store": resources["store"]}) as context:
        [request] = sensor_def.evaluate_tick(context).run_requests  # 4 records: min_new_records is 3
    assert request.tags[RANGE_TAG] == f"1-{records[-1]['id']}"

    result = materialize(
        parts["assets"],
        instance=instance,
        resources=resources,
        selection=AssetSelection.assets(["tiny", "feedback_sft_dataset"], ["tiny", "feedback_pairs"]),
        tags={RANGE_TAG: request.tags[RANGE_TAG], PIPELINE_TAG: "tiny"},
    )
    assert result.success
    out = {
        e.asset_key.path[-1]: e.metadata
        for e in (ev.event_specific_data.materialization for ev in result.get_asset_materialization_events())
    }
    sft_dir = Path(out["feedback_sft_dataset"]["artifact_dir"].value)
    sft = [json.loads(line) for f in ("train.jsonl", "eval.jsonl") for line in (sft_dir / f).read_text().splitlines()]
    assert sorted(r["completion"][0]["content"] for r in sft) == sorted(
        ["Re-pair the chime in Settings > Chime.", FIXED, "Update the app."]
    ), "the liked replies and the edit, from the traces"
    pairs_dir = Path(out["feedback_pairs"]["artifact_dir"].value)
    pairs = [
        json.loads(line) for f in ("train.jsonl", "eval.jsonl") for line in (pairs_dir / f).read_text().splitlines()
    ]
    assert sorted((p["chosen"][0]["content"], p["rejected"][0]["content"]) for p in pairs) == sorted(
        [("Re-pair the chime in Settings > Chime.", "Try turning it off."), (FIXED, "It is fine.")]
    )
    used = json.loads((sft_dir / "records.json").read_text())
    assert {r["trace_id"] for r in used} == {ids["down"], ids["up"], ids["edit"], ids["plug"]}
    assert out["feedback_sft_dataset"]["feedback_range"].value == request.tags[RANGE_TAG]

    # a new rating comes after the range: the next one starts past it and holds only the new record
    thumbs(ids["unrated"], True)
    [new] = source.records(after_id=records[-1]["id"])
    assert new["trace_id"] == ids["unrated"] and new["id"] > records[-1]["id"] and source.count(records[-1]["id"]) == 1


def test_retraining_from_an_experiment_s_traces_runs_end_to_end(tracing_to, chain_copy, tmp_path):
    """The whole retraining (datasets, SFT, DPO, KTO, merge, report, gate) from the deployed tiny model, on records
    that are only traces: its SFT rows and pairs are the traces' liked replies, edit and pairs."""
    from tests.assets.test_retraining import parts_and_resources, retrain_every_step

    materialized = chain_copy  # it retrains and may promote: on a copy of the chain's stores
    experiment, ids = traced_assistant(tracing_to)
    last = TraceFeedback(tracing_to, experiment).max_id()
    _, resources = parts_and_resources(materialized)
    loaded = materialized["pipeline"]
    feedback = loaded.feedback.model_copy(
        update={"source": FeedbackSource(mlflow_experiment=experiment, tracking_uri=tracing_to)}
    )
    parts = build_pipeline_defs(loaded.model_copy(update={"feedback": feedback}))
    # an instance of its own, so the session's records-used accounting (store ids) is not mixed with trace
    # ids, holding the chain's stored outputs (the report reads the pipeline's dataset through the IO manager)
    shutil.copytree(Path(materialized["instance"].root_directory) / "storage", tmp_path / "home" / "storage")
    instance = DagsterInstance.local_temp(str(tmp_path / "home"))
    _, events = retrain_every_step(parts, instance, resources, {RANGE_TAG: f"1-{last}", PIPELINE_TAG: "tiny"})
    assert events["feedback_sft_dataset"]["rows"].value == 3  # two liked replies and the edit
    assert events["feedback_pairs"]["rows"].value == 2  # liked vs disliked, edited vs original
    assert "skipped" not in events["sft_on_feedback"] and "skipped" not in events["dpo_on_feedback"]
    used = json.loads((Path(events["feedback_pairs"]["artifact_dir"].value) / "records.json").read_text())
    assert {r["trace_id"] for r in used} == {ids["down"], ids["up"], ids["edit"], ids["plug"]}
    assert "retrained_report" in events
