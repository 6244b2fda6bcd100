"""Automation of retraining from chat feedback: a sensor that requests it when enough new records arrive, and
a nightly schedule that requests it when there is any. Both name the record range in a run tag."""

from dagster import (AssetKey, DefaultScheduleStatus, DefaultSensorStatus, RunRequest, SkipReason, schedule, sensor)

from ..engine.feedback import FeedbackStore
from ..engine.spec.pipeline import Pipeline
from ..resources import ArtifactStore

RANGE_TAG = "dragon/feedback_range"   # "first_id-last_id": the records a retraining run used


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
    used_key = AssetKey([pipeline.name, "feedback_sft_dataset"])

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
