"""Retraining from chat feedback: the feedback store as an observable source, datasets made from it, a job
that continues from the deployed model (SFT, then DPO when there are pairs, merge, report), and the asset check
that gates promotion of the retrained model. The sensor and schedule that request it are in automation.py.

A record that cannot be used (turns not JSON or malformed, no user turn, an edit without text) is skipped and
counted in the dataset's metadata and manifest; it never fails the range it is in.
"""

import json
from collections.abc import Iterator
from pathlib import Path

from dagster import (AssetCheckResult, AssetCheckSeverity, AssetIn, AssetKey, AssetSelection, DataVersion, Failure,
                     MetadataValue, Output, asset, asset_check, define_asset_job, observable_source_asset)

from ..engine.data import tables as data_lib
from ..engine.artifacts import read_manifest, write_manifest
from ..engine.feedback import (FeedbackStore, SKIP_REASONS, check_record, preference_pairs, sft_conversations,
                               usable_records)
from ..engine.spec.pipeline import FeedbackDPO, FeedbackSFT, Pipeline
from ..engine.spec.stages import Merge
from ..resources import ArtifactStore, MLflowTracking, TrainingResource
from .automation import PIPELINE_TAG, RANGE_TAG, feedback_schedule, feedback_sensor, retrain_job_name
from .metadata import md_table
from .adapter_stage import run_training_stage
from .registry import deployed_model, promote_merged, report_merged_dir
from .factory import POOL_EXECUTOR, POOL_TAGS, TRAINING_POOL
from .launchpad import effective, launchpad_config

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


def feedback_source(pipeline: Pipeline):
    @observable_source_asset(key=key(pipeline, "chat_feedback"), group_name=pipeline.name,
                             description="Ratings and edits collected while chatting (append-only SQLite). Its "
                                         "data version is the newest record id, so it changes with new feedback.")
    def _observe(store: ArtifactStore) -> DataVersion:
        return DataVersion(str(FeedbackStore(store.feedback_path(pipeline.name)).max_id()))
    return _observe


def feedback_dataset(pipeline: Pipeline, name: str, pairs: bool):
    @asset(key=key(pipeline, name), group_name=pipeline.name, kinds={"dataset"},
           deps=[key(pipeline, "chat_feedback")], output_required=False,
           description=("Prompts that got a liked-or-edited reply and a disliked one, as preference pairs."
                        if pairs else "Liked or edited replies with the turns before them, as conversations "
                                      "(an edit replaces the reply).")
                       + " Outside a retraining run (\"Materialize all\") it is skipped, with the reason in the "
                         "run's log, while there is no feedback to retrain on: the retraining after it is skipped "
                         "too.")
    def _dataset(context, store: ArtifactStore) -> Iterator[Output[str]]:
        feedback = FeedbackStore(store.feedback_path(pipeline.name))
        first, last = record_range(context, feedback)
        records = feedback.records(after_id=first - 1, up_to_id=last)
        usable, skipped = usable_records(records)
        n_skipped = sum(skipped.values())
        if n_skipped:
            context.log.warning(f"skipped {n_skipped} of {len(records)} feedback records in {first}-{last}: "
                                + "; ".join(f"{n} {SKIP_REASONS[why]} ({why})" for why, n in skipped.items()))
        conversations = [data_lib.conversation_row(c["messages"], i)
                         for i, c in enumerate(sft_conversations(usable))]
        reason = None if conversations else no_feedback_reason(first, last, len(records), n_skipped, skipped)
        if reason and not (context.run and context.run.tags.get(RANGE_TAG)):
            # a run nobody asked to retrain ("Materialize all" before anyone chatted, say): no output, so the
            # retraining, merge, report and promotion gate after it are skipped and the run still succeeds
            context.log.info(f"{name} skipped: {reason}")
            return
        if reason and not pairs:
            # the sensor or schedule asked for this range: a failure, which their retry back-off counts
            raise Failure(description=reason)
        rows = preference_pairs(usable) if pairs else conversations
        train, held = data_lib.split_rows(rows, 0.1) if rows else ([], [])
        with store.new_artifact(pipeline.name, name, context.run_id) as (tmp, final):
            data_lib.write_jsonl(tmp / "train.jsonl", train)
            data_lib.write_jsonl(tmp / "eval.jsonl", held)
            # which records, and why any was skipped; the turns stay in the store (turns_id), not copied here
            (tmp / "records.json").write_text(json.dumps(
                [{**{k: r.get(k) for k in ("id", "conversation_id", "turns_id", "verdict", "reply", "edited",
                                           "model", "created")}, "skipped": check_record(r)} for r in records],
                indent=1, default=str))
            write_manifest(tmp, kind="feedback_pairs" if pairs else "feedback_sft_dataset", first_id=first,
                           last_id=last, records=len(records), rows=len(rows), skipped_records=n_skipped,
                           skipped=skipped, dagster_run_id=context.run_id)
        preview = [{"prompt": data_lib.user_text(r), "reply": data_lib.reply_text(r)} for r in rows[:5]]
        yield Output(str(final), metadata={"artifact_dir": MetadataValue.path(str(final)), "rows": len(rows),
                                           "records": len(records), "skipped_records": n_skipped,
                                           "skipped_by_reason": MetadataValue.json(skipped),
                                           "feedback_up_to": last, "feedback_range": f"{first}-{last}",
                                           "preview": md_table(preview)})
    return _dataset


def no_feedback_reason(first: int, last: int, n_records: int, n_skipped: int, skipped: dict) -> str:
    """Why a feedback dataset has nothing to retrain on, for the run's log (or the failure of a requested run)."""
    if n_records == 0:
        return (f"no feedback records yet (range {first}-{last}); rate or edit replies in the chat, and the feedback "
                f"sensor or schedule requests retraining")
    return (f"no liked or edited replies among feedback records {first}-{last} ({n_records} records, "
            f"{n_skipped} skipped as unusable: {skipped})")


def retrain_sft(pipeline: Pipeline, stage: FeedbackSFT):
    @asset(key=key(pipeline, stage.name), group_name=pipeline.name, kinds={"pytorch", "mlflow"},
           ins={"dataset": AssetIn(key=key(pipeline, stage.dataset))}, pool=TRAINING_POOL, op_tags=POOL_TAGS,
           description="SFT on the feedback conversations, starting from the deployed model.")
    def _sft(context, config: launchpad_config(stage), store: ArtifactStore, tracking: MLflowTracking,
             training: TrainingResource, dataset: str) -> Output[str]:
        start = deployed_model(tracking, store, pipeline)
        return run_training_stage(context, pipeline, effective(stage, config), dataset, None, False, store,
                                  tracking, training, start_model=str(start),
                                  tags={"feedback_range": context.run.tags.get(RANGE_TAG)})
    return _sft


def retrain_dpo(pipeline: Pipeline, stage: FeedbackDPO, after: str):
    @asset(key=key(pipeline, stage.name), group_name=pipeline.name, kinds={"pytorch", "mlflow"},
           ins={"pairs": AssetIn(key=key(pipeline, stage.dataset)), "previous": AssetIn(key=key(pipeline, after))},
           pool=TRAINING_POOL, op_tags=POOL_TAGS,
           description="DPO on the feedback pairs after the feedback SFT; passes the SFT adapter on when there "
                       "are no pairs.")
    def _dpo(context, config: launchpad_config(stage), store: ArtifactStore, tracking: MLflowTracking,
             training: TrainingResource, pairs: str, previous: str) -> Output[str]:
        if not (Path(pairs) / "train.jsonl").read_text().strip():
            context.log.info("no feedback pairs: the feedback SFT adapter goes on unchanged")
            return Output(previous, metadata={"artifact_dir": MetadataValue.path(previous), "skipped": True})
        return run_training_stage(context, pipeline, effective(stage, config), pairs, previous, False, store,
                                  tracking, training, tags={"feedback_range": context.run.tags.get(RANGE_TAG)})
    return _dpo


def promotion_check(pipeline: Pipeline, report_key: AssetKey):
    @asset_check(asset=report_key, name="promotion_gate", blocking=True,
                 description="The retrained model is not worse than the model it started from on held-out loss "
                             "and task metrics, and that model is still the champion; passing makes it the "
                             "champion in the MLflow Model Registry (the model chat and the next retraining use).")
    def _gate(context, store: ArtifactStore, tracking: MLflowTracking) -> AssetCheckResult:
        event = context.instance.get_latest_materialization_event(report_key)
        report_dir = Path(event.asset_materialization.metadata["artifact_dir"].value)
        report = json.loads((report_dir / "report.json").read_text())
        merged_dir = report_merged_dir(report_dir)
        worse = regressions(report["base"], report["merged"])
        started_from = read_manifest(merged_dir).get("resolved_model")
        live = deployed_model(tracking, store, pipeline) if started_from else None
        if started_from and Path(started_from) != live:
            # compared with a model that is no longer live (a rollback or a new pipeline model meanwhile)
            worse.append(f"champion moved during the retraining (started from {started_from}, now {live})")
        promoted = {}
        if not worse:
            promoted = promote_merged(context, pipeline.name, tracking, merged_dir,
                                      f"{report_key.to_user_string()}: promotion_gate passed")
        return AssetCheckResult(passed=not worse, severity=AssetCheckSeverity.ERROR,
                                metadata={"regressions": ", ".join(worse) or "none",
                                          "start_eval_loss": report["base"]["eval_loss"],
                                          "retrained_eval_loss": report["merged"]["eval_loss"], **promoted})
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


def build_feedback_defs(pipeline: Pipeline) -> dict:
    """Everything the feedback loop adds to a pipeline with a `feedback:` section."""
    from .factory import evaluate_asset, merge_asset

    settings = pipeline.feedback
    merge = Merge(name="retrained_model", kind="merge")
    assets = [feedback_source(pipeline), feedback_dataset(pipeline, settings.sft.dataset, pairs=False),
              feedback_dataset(pipeline, settings.dpo.dataset, pairs=True),
              retrain_sft(pipeline, settings.sft), retrain_dpo(pipeline, settings.dpo, after=settings.sft.name),
              merge_asset(pipeline, merge, upstream=[settings.dpo.name]),
              evaluate_asset(pipeline, settings.evaluate, upstream=[merge.name, settings.evaluate.dataset])]
    names = ["feedback_sft_dataset", "feedback_pairs", "feedback_sft_adapter", "feedback_dpo_adapter",
             "retrained_model", "retrained_report"]
    job = define_asset_job(retrain_job_name(pipeline), selection=AssetSelection.assets(
        *[key(pipeline, n) for n in names]), description="Retrain the deployed model on chat feedback.",
        run_tags={PIPELINE_TAG: pipeline.name}, executor_def=POOL_EXECUTOR)
    return {"assets": assets, "asset_checks": [promotion_check(pipeline, key(pipeline, "retrained_report"))],
            "jobs": [job], "sensors": [feedback_sensor(pipeline, settings.min_new_records, job)],
            "schedules": [feedback_schedule(pipeline, settings.cron, job)]}
