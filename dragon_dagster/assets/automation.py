"""Automation of retraining from chat feedback: a sensor that requests it when enough new records arrive, and
a nightly schedule that requests it when there is any. Both name the record range in a run tag.

Records count as used only once a retraining on them succeeded: both read the last used id from the Dagster
instance (`last_used_id`: the newest feedback_sft_dataset materialization whose run succeeded and produced the
retrained report), never from a cursor moved when a run is requested. So a failed or cancelled retraining
leaves its records to the next tick, which requests them again under a new run key (`...-<attempt>`). Neither
requests a run while a retraining of the pipeline is still going. After MAX_FAILED_ATTEMPTS failed runs since
the last success, the sensor waits for min_new_records more records before trying again (the nightly
schedule still tries once a night), so a retraining that always fails (its promotion gate, say) does not
loop every minute.

The sensor also says what it decided where people look: whenever its decision or the records change, it records
an observation of the chat_feedback source (the newest record id as its data version, how many records are new,
how many a retraining waits for, and the decision in words), so the source's page reads "2 new feedback records
...; waiting for 3" rather than a tick list of "0 runs requested".
"""

from __future__ import annotations

from dagster import (
    AssetKey,
    AssetObservation,
    DagsterEventType,
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    DefaultScheduleStatus,
    DefaultSensorStatus,
    MetadataValue,
    RunRequest,
    RunsFilter,
    SensorResult,
    SkipReason,
    schedule,
    sensor,
)

from ..engine.data.trace_feedback import TraceFeedback
from ..engine.pipeline import Pipeline
from ..engine.pipeline.objectives import OBJECTIVES
from ..resources import ArtifactStore, MLflowTracking

RANGE_TAG = "dragon/feedback_range"  # "first_id-last_id": the records a retraining run used
PIPELINE_TAG = "dragon/feedback_pipeline"  # whose feedback a retraining run used
MAX_FAILED_ATTEMPTS = 3  # failed runs since the last success before the sensor waits for more
# The tag Dagster reads an observation's data version from (what an observable source's DataVersion becomes): the
# sensor's observations keep the chat_feedback source's data version, so "unsynced" follows them too.
DATA_VERSION_TAG = "dagster/data_version"
UNFINISHED = [
    DagsterRunStatus.QUEUED,
    DagsterRunStatus.NOT_STARTED,
    DagsterRunStatus.MANAGED,
    DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
    DagsterRunStatus.SUSPENDED,
    DagsterRunStatus.CANCELING,
]
FAILED = [DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED]


def retrain_job_name(pipeline: Pipeline) -> str:
    return f"{pipeline.name}_retrain_from_feedback"


def parse_range(value: str | None) -> tuple[int, int] | None:
    """(first, last) from a RANGE_TAG value, None when absent or malformed."""
    try:
        first, last = (int(x) for x in str(value).split("-"))
    except (TypeError, ValueError):
        return None
    return first, last


def feedback_records(pipeline: Pipeline, store: ArtifactStore, tracking: MLflowTracking | None = None):
    """Where the pipeline's feedback records come from (feedback.source): the chat's feedback store, or the human
    assessments on an MLflow experiment's traces. Both read alike (max_id, count, records), with ids that grow
    as feedback arrives, so record ranges and data versions mean the same for either."""
    source = pipeline.feedback.source if pipeline.feedback is not None else None
    if source is not None and source.mlflow_experiment:
        # the sensor, the schedule and the observation take the store alone: its runs dir gives the tracking
        # resource's default (the source's own tracking_uri, or $MLFLOW_TRACKING_URI, wins over it)
        tracking = tracking if tracking is not None else MLflowTracking(runs_dir=store.runs_dir)
        uri = source.tracking_uri or tracking.uri
        return TraceFeedback(uri, source.mlflow_experiment, thumbs=source.thumbs, edited=source.edited)
    return store.feedback_store(pipeline.name)


def last_used_id(instance: DagsterInstance, pipeline_name: str) -> int:
    """The last feedback record id a completed retraining used (0 if none has): the `feedback_up_to` of the
    newest materialization of the first objective's dataset (a retraining makes every objective's dataset from
    one range) whose run went as far as materializing retrained_report.
    A run that failed before its report used nothing; a run whose report the promotion gate rejected used
    its records (retraining on them again would give the same model), though the run shows as failed."""
    dataset_key = AssetKey([pipeline_name, OBJECTIVES[0].dataset])
    report_key = AssetKey([pipeline_name, "retrained_report"])
    cursor, checked = None, set()
    while True:
        found = instance.fetch_materializations(dataset_key, limit=100, cursor=cursor)  # newest first
        for record in found.records:
            up_to = record.asset_materialization.metadata.get("feedback_up_to")
            if up_to is None or not record.run_id or record.run_id in checked:
                continue
            checked.add(record.run_id)
            if any(
                e.dagster_event and e.dagster_event.asset_key == report_key
                for e in instance.all_logs(record.run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION)
            ):
                return int(up_to.value)
        if not found.has_more:
            return 0
        cursor = found.cursor


def unfinished_runs(instance: DagsterInstance, pipeline: Pipeline) -> list[DagsterRun]:
    """Retraining runs of this pipeline that are queued or going (by job name or by the pipeline tag)."""
    runs = {
        r.run_id: r for r in instance.get_runs(RunsFilter(job_name=retrain_job_name(pipeline), statuses=UNFINISHED))
    }
    runs.update(
        {r.run_id: r for r in instance.get_runs(RunsFilter(tags={PIPELINE_TAG: pipeline.name}, statuses=UNFINISHED))}
    )
    return list(runs.values())


def _request(instance: DagsterInstance, pipeline: Pipeline, used: int, newest: int, prefix: str) -> RunRequest:
    feedback_range = f"{used + 1}-{newest}"
    tags = {RANGE_TAG: feedback_range, PIPELINE_TAG: pipeline.name}
    attempt = instance.get_runs_count(RunsFilter(tags=tags)) + 1  # a retried range gets a new run key
    return RunRequest(run_key=f"{prefix}-{feedback_range}-{attempt}", tags=tags)


def _running(instance: DagsterInstance, pipeline: Pipeline) -> SkipReason | None:
    running = unfinished_runs(instance, pipeline)
    if running:
        return SkipReason(
            f"retraining run {running[0].run_id} (records {running[0].tags.get(RANGE_TAG, 'all')}) has not finished"
        )
    return None


def feedback_observation(pipeline: Pipeline, used: int, new: int, newest: int, min_new: int, said: str):
    """The chat_feedback source as the sensor last saw it: its records, what is new, and the decision in words."""
    return AssetObservation(
        asset_key=AssetKey([pipeline.name, "chat_feedback"]),
        description=said,
        metadata={
            "retraining": MetadataValue.text(said),
            "new_records": new,
            "records_for_a_retraining": min_new,
            "newest_record": newest,
            "used_up_to": used,
        },
        tags={DATA_VERSION_TAG: str(newest)},  # the same data version the source's own observation gives
    )


def feedback_sensor(pipeline: Pipeline, min_new: int, job):
    @sensor(
        name=f"{pipeline.name}_feedback_sensor",
        job=job,
        minimum_interval_seconds=60,
        default_status=DefaultSensorStatus.RUNNING,
        description=f"Requests retraining when at least {min_new} feedback records exist that no successful "
        f"retraining used; a failed retraining's records are requested again.",
    )
    def _sensor(context, store: ArtifactStore):
        instance = context.instance
        source = feedback_records(pipeline, store)
        used = last_used_id(instance, pipeline.name)
        # counted, not subtracted: a traces source's ids are times, not consecutive (trace_feedback.py). Counted
        # before the newest id is read: records keep arriving, and the range requested must hold every record
        # counted (read the other way round, a count of 3 could request a range of 2)
        new = source.count(after_id=used)
        newest = source.max_id()
        decision = _decide(instance, source, used, new, newest)
        said = (
            decision.skip_message
            if isinstance(decision, SkipReason)
            else f"retraining requested on records {decision.tags[RANGE_TAG]}"
        )
        shown = f"{used}:{newest}:{said}"  # the cursor: what the source's page last showed
        events = [] if context.cursor == shown else [feedback_observation(pipeline, used, new, newest, min_new, said)]
        if isinstance(decision, SkipReason):
            return SensorResult(skip_reason=decision, cursor=shown, asset_events=events)
        return SensorResult(run_requests=[decision], cursor=shown, asset_events=events)

    def _decide(instance, source, used: int, new: int, newest: int) -> RunRequest | SkipReason:
        if new < min_new:
            return SkipReason(
                f"{new} new feedback records since the last successful retraining "
                f"(records up to {used}); waiting for {min_new}"
            )
        busy = _running(instance, pipeline)
        if busy:
            return busy
        failed = [
            r
            for r in instance.get_runs(RunsFilter(tags={PIPELINE_TAG: pipeline.name}, statuses=FAILED), limit=500)
            if (parse_range(r.tags.get(RANGE_TAG)) or (0, 0))[0] == used + 1
        ]
        if len(failed) >= MAX_FAILED_ATTEMPTS:
            reached = max(parse_range(r.tags[RANGE_TAG])[1] for r in failed)
            if (source.count(after_id=reached) if newest > reached else 0) < min_new:
                return SkipReason(
                    f"{len(failed)} retraining runs on the records after {used} failed (the last "
                    f"covered up to {reached}); waiting for {min_new} records beyond {reached} "
                    f"before trying again"
                )
        return _request(instance, pipeline, used, newest, "feedback")

    return _sensor


def feedback_schedule(pipeline: Pipeline, cron: str, job):
    @schedule(
        name=f"{pipeline.name}_retrain_schedule",
        cron_schedule=cron,
        job=job,
        default_status=DefaultScheduleStatus.RUNNING,
        description="Retrains on the feedback that no successful retraining used yet; skips when there is none.",
    )
    def _schedule(context, store: ArtifactStore):
        instance = context.instance
        newest = feedback_records(pipeline, store).max_id()
        used = last_used_id(instance, pipeline.name)
        if newest <= used:
            return SkipReason(f"no new feedback since the last retraining (records up to {used})")
        return _running(instance, pipeline) or _request(instance, pipeline, used, newest, "scheduled")

    return _schedule
