"""Retraining from chat feedback: the feedback store as an observable source, datasets made from it, a job
that continues from the deployed model (SFT, then DPO when there are pairs, merge, report), a sensor and a
schedule that request it, and the asset check that gates promotion of the retrained model.
"""

import json
import time
from pathlib import Path

from dagster import (AssetCheckResult, AssetCheckSeverity, AssetIn, AssetKey, AssetSelection, DataVersion,
                     DefaultScheduleStatus, DefaultSensorStatus, Failure, MetadataValue, Output, RunRequest,
                     SkipReason, asset, asset_check, define_asset_job, observable_source_asset, schedule, sensor)

from ..engine import data as data_lib
from ..engine.artifacts import write_manifest
from ..engine.feedback import FeedbackStore, preference_pairs, sft_conversations
from ..engine.pipeline_spec import Pipeline, Stage
from ..engine.runs import latest_artifact
from ..engine.settings import merged
from ..resources import ArtifactStore, MLflowTracking, TrainingResource
from .metadata import md_table
from .training_stage import run_training_stage

RANGE_TAG = "dragon/feedback_range"   # "first_id-last_id": the records a retraining run used
TRAINING_POOL = "training"
TOLERANCE = {"eval_loss": 0.02, "token_f1": 0.02, "exact": 0.0, "contains": 0.0, "numeric": 0.0}


def key(pipeline: Pipeline, name: str) -> AssetKey:
    return AssetKey([pipeline.name, name])


def record_range(context, store: FeedbackStore) -> tuple[int, int]:
    """(first id, last id) of the records this run uses: from the run's tag, else everything so far."""
    tag = context.run.tags.get(RANGE_TAG) if context.run else None
    if tag:
        first, last = (int(x) for x in tag.split("-"))
        return first, last
    return 1, store.max_id()


def deployed_model(store: ArtifactStore, pipeline: Pipeline) -> Path:
    """The model people chat with: the last promoted retrained model, else the latest merged model."""
    pointer = store.deployed_pointer(pipeline.name)
    if pointer.exists():
        return Path(json.loads(pointer.read_text())["model_dir"])
    merge = pipeline.first("merge")
    found = latest_artifact(store.root, f"{pipeline.name}/{merge.name}")
    if found is None:
        raise Failure(description=f"no deployed model yet: materialize {pipeline.name}/{merge.name} first")
    return found / "model"


def feedback_source(pipeline: Pipeline):
    @observable_source_asset(key=key(pipeline, "chat_feedback"), group_name=pipeline.name,
                             description="Ratings and edits collected while chatting (append-only SQLite). Its "
                                         "data version is the newest record id, so it changes with new feedback.")
    def _observe(store: ArtifactStore) -> DataVersion:
        return DataVersion(str(FeedbackStore(store.feedback_path(pipeline.name)).max_id()))
    return _observe


def feedback_dataset(pipeline: Pipeline, name: str, pairs: bool):
    @asset(key=key(pipeline, name), group_name=pipeline.name, kinds={"dataset"},
           deps=[key(pipeline, "chat_feedback")],
           description=("Prompts that got a liked-or-edited reply and a disliked one, as preference pairs."
                        if pairs else "Liked or edited replies with the turns before them, as conversations "
                                      "(an edit replaces the reply)."))
    def _dataset(context, store: ArtifactStore) -> Output[str]:
        feedback = FeedbackStore(store.feedback_path(pipeline.name))
        first, last = record_range(context, feedback)
        records = feedback.records(after_id=first - 1, up_to_id=last)
        if pairs:
            rows = preference_pairs(records)
        else:
            rows = [data_lib.conversation_row(c["messages"], i) for i, c in enumerate(sft_conversations(records))]
            if not rows:
                raise Failure(description=f"no liked or edited replies among feedback records {first}-{last}")
        train, held = data_lib.split_rows(rows, 0.1) if rows else ([], [])
        with store.new_artifact(pipeline.name, name, context.run_id) as (tmp, final):
            data_lib.write_jsonl(tmp / "train.jsonl", train)
            data_lib.write_jsonl(tmp / "eval.jsonl", held)
            (tmp / "records.json").write_text(json.dumps(records, indent=1, default=str))
            write_manifest(tmp, kind="feedback_pairs" if pairs else "feedback_sft_dataset", first_id=first,
                           last_id=last, records=len(records), rows=len(rows), dagster_run_id=context.run_id)
        preview = [{"prompt": data_lib.user_text(r), "reply": data_lib.reply_text(r)} for r in rows[:5]]
        return Output(str(final), metadata={"artifact_dir": MetadataValue.path(str(final)), "rows": len(rows),
                                            "records": len(records), "feedback_up_to": last,
                                            "feedback_range": f"{first}-{last}", "preview": md_table(preview)})
    return _dataset


def retrain_sft(pipeline: Pipeline, settings: dict):
    @asset(key=key(pipeline, "feedback_sft_adapter"), group_name=pipeline.name, kinds={"pytorch", "mlflow"},
           ins={"dataset": AssetIn(key=key(pipeline, "feedback_sft_dataset"))}, pool=TRAINING_POOL,
           description="SFT on the feedback conversations, starting from the deployed model.")
    def _sft(context, store: ArtifactStore, tracking: MLflowTracking, training: TrainingResource,
             dataset: str) -> Output[str]:
        stage = Stage("feedback_sft_adapter", "sft", settings)
        start = deployed_model(store, pipeline)
        return run_training_stage(context, pipeline, stage, "sft", stage_settings(settings), dataset, None, False,
                                  store, tracking, training, start_model=str(start),
                                  tags={"feedback_range": context.run.tags.get(RANGE_TAG)})
    return _sft


def retrain_dpo(pipeline: Pipeline, settings: dict):
    @asset(key=key(pipeline, "feedback_dpo_adapter"), group_name=pipeline.name, kinds={"pytorch", "mlflow"},
           ins={"pairs": AssetIn(key=key(pipeline, "feedback_pairs")),
                "previous": AssetIn(key=key(pipeline, "feedback_sft_adapter"))}, pool=TRAINING_POOL,
           description="DPO on the feedback pairs after the feedback SFT; passes the SFT adapter on when there "
                       "are no pairs.")
    def _dpo(context, store: ArtifactStore, tracking: MLflowTracking, training: TrainingResource, pairs: str,
             previous: str) -> Output[str]:
        if not (Path(pairs) / "train.jsonl").read_text().strip():
            context.log.info("no feedback pairs: the feedback SFT adapter goes on unchanged")
            return Output(previous, metadata={"artifact_dir": MetadataValue.path(previous), "skipped": True})
        stage = Stage("feedback_dpo_adapter", "preference", settings)
        full = {**stage_settings(settings), "beta": settings.get("beta", 0.1)}
        return run_training_stage(context, pipeline, stage, "dpo", full, pairs, previous, False, store, tracking,
                                  training, tags={"feedback_range": context.run.tags.get(RANGE_TAG)})
    return _dpo


def stage_settings(settings: dict) -> dict:
    return {"lora": settings.get("lora") or {}, "args": settings.get("args") or {},
            "n_samples": settings.get("n_samples", 3), "max_new_tokens": settings.get("max_new_tokens", 64)}


def promotion_check(pipeline: Pipeline, report_key: AssetKey):
    @asset_check(asset=report_key, name="promotion_gate", blocking=True,
                 description="The retrained model is not worse than the model it started from on held-out loss "
                             "and task metrics; passing promotes it to the deployed model.")
    def _gate(context, store: ArtifactStore) -> AssetCheckResult:
        event = context.instance.get_latest_materialization_event(report_key)
        report_dir = Path(event.asset_materialization.metadata["artifact_dir"].value)
        report = json.loads((report_dir / "report.json").read_text())
        worse = regressions(report["base"], report["merged"])
        if not worse:
            merged_dir = json.loads((report_dir / "manifest.json").read_text())["merged"]
            pointer = store.deployed_pointer(pipeline.name)
            pointer.parent.mkdir(parents=True, exist_ok=True)
            pointer.write_text(json.dumps({"model_dir": str(Path(merged_dir) / "model"), "report": str(report_dir),
                                           "promoted_at": time.strftime("%Y-%m-%dT%H:%M:%S")}))
        return AssetCheckResult(passed=not worse, severity=AssetCheckSeverity.ERROR,
                                metadata={"regressions": ", ".join(worse) or "none",
                                          "start_eval_loss": report["base"]["eval_loss"],
                                          "retrained_eval_loss": report["merged"]["eval_loss"]})
    return _gate


def regressions(start: dict, retrained: dict) -> list[str]:
    """Figures where the retrained model is worse than where it started, beyond a small tolerance."""
    worse = []
    if retrained["eval_loss"] > start["eval_loss"] + TOLERANCE["eval_loss"]:
        worse.append("eval_loss")
    for name, tolerance in TOLERANCE.items():
        if name in start.get("metrics", {}) and retrained["metrics"].get(name, 0) < start["metrics"][name] - tolerance:
            worse.append(name)
    return worse


def retrain_job_name(pipeline: Pipeline) -> str:
    return f"{pipeline.name}_retrain_from_feedback"


def feedback_sensor(pipeline: Pipeline, min_new: int, job):
    @sensor(name=f"{pipeline.name}_feedback_sensor", job=job, minimum_interval_seconds=60,
            default_status=DefaultSensorStatus.RUNNING,
            description=f"Requests retraining when at least {min_new} new feedback records exist.")
    def _sensor(context, store: ArtifactStore):
        last_used = int(context.cursor or 0)
        newest = FeedbackStore(store.feedback_path(pipeline.name)).max_id()
        if newest - last_used < min_new:
            return SkipReason(f"{newest - last_used} new feedback records; waiting for {min_new}")
        context.update_cursor(str(newest))
        feedback_range = f"{last_used + 1}-{newest}"
        return RunRequest(run_key=f"feedback-{feedback_range}", tags={RANGE_TAG: feedback_range})
    return _sensor


def feedback_schedule(pipeline: Pipeline, cron: str, job):
    used_key = key(pipeline, "feedback_sft_dataset")

    @schedule(name=f"{pipeline.name}_retrain_schedule", cron_schedule=cron, job=job,
              default_status=DefaultScheduleStatus.RUNNING,
              description="Retrains on the feedback collected since the last retraining; skips when there is none.")
    def _schedule(context, store: ArtifactStore):
        newest = FeedbackStore(store.feedback_path(pipeline.name)).max_id()
        event = context.instance.get_latest_materialization_event(used_key)
        used = int(event.asset_materialization.metadata["feedback_up_to"].value) if event else 0
        if newest <= used:
            return SkipReason(f"no new feedback since the last retraining (records up to {used})")
        feedback_range = f"{used + 1}-{newest}"
        return RunRequest(run_key=f"scheduled-{feedback_range}", tags={RANGE_TAG: feedback_range})
    return _schedule


def build_feedback_defs(pipeline: Pipeline, merge_asset, evaluate_asset) -> dict:
    """Everything the feedback loop adds to a pipeline with a `feedback:` section."""
    settings = pipeline.feedback or {}
    held_out = pipeline.first("chat_dataset")
    report = Stage("retrained_report", "evaluate", {**(settings.get("evaluate") or {}), "n_judge": 0},
                   upstream=["retrained_model", held_out.name])
    assets = [feedback_source(pipeline), feedback_dataset(pipeline, "feedback_sft_dataset", pairs=False),
              feedback_dataset(pipeline, "feedback_pairs", pairs=True),
              retrain_sft(pipeline, merged({"args": {"epochs": 1}}, settings.get("sft"))),
              retrain_dpo(pipeline, merged({"args": {"epochs": 1, "learning_rate": 5e-5}}, settings.get("dpo"))),
              merge_asset(pipeline, Stage("retrained_model", "merge", {}, upstream=["feedback_dpo_adapter"])),
              evaluate_asset(pipeline, report)]
    names = ["feedback_sft_dataset", "feedback_pairs", "feedback_sft_adapter", "feedback_dpo_adapter",
             "retrained_model", "retrained_report"]
    job = define_asset_job(retrain_job_name(pipeline), selection=AssetSelection.assets(
        *[key(pipeline, n) for n in names]), description="Retrain the deployed model on chat feedback.")
    return {"assets": assets, "asset_checks": [promotion_check(pipeline, key(pipeline, "retrained_report"))],
            "jobs": [job], "sensors": [feedback_sensor(pipeline, int(settings.get("min_new_records", 20)), job)],
            "schedules": [feedback_schedule(pipeline, str(settings.get("cron", "0 2 * * *")), job)]}
