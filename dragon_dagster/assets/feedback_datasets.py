"""The feedback records as Dagster sees them: the feedback source (an observable source asset whose data version
is the newest record id) and one dataset asset per retraining objective (engine/pipeline/objectives.py), each
written from the records of the run's range.

A record that cannot be used (turns not JSON or malformed, no user turn, an edit without text) is skipped and
counted in the dataset's metadata and manifest; it never fails the range it is in. A range that gives no
objective anything to train on is `Skipped`: outside a requested retraining that is Dagster's own skip (no
output, so the steps after it are skipped and the run succeeds), inside one a failure the sensor's back-off counts.
"""

import json
import warnings
from collections.abc import Iterator

from dagster import BetaWarning, DataVersion, Failure, MetadataValue, Output, asset, observable_source_asset

from ..engine.artifacts.manifest import FeedbackDatasetManifest, write_manifest
from ..engine.data import row_parts, tables
from ..engine.data.feedback.store import FeedbackSource
from ..engine.data.feedback_rows import SKIP_REASONS, check_record
from ..engine.data.pii import redactor
from ..engine.pipeline import Pipeline
from ..engine.pipeline.objectives import FeedbackRange, Objective
from ..resources import ArtifactStore, MLflowTracking
from .asset_wiring import key, retraining_group
from .automation import RANGE_TAG, feedback_records
from .feedback_taste import taste_rewards
from .metadata import log_pii, md_table, pii_metadata

# what records.json keeps of each record: which it is and how it was rated; its turns stay in the store (turns_id)
PROVENANCE = ("id", "conversation_id", "turns_id", "verdict", "reply", "edited", "model", "created", "trace_id")


def record_range(context, store: FeedbackSource) -> tuple[int, int]:
    """(first id, last id) of the records this run uses: from the run's tag, else everything so far."""
    tag = context.run.tags.get(RANGE_TAG) if context.run else None
    if tag:
        first, last = (int(x) for x in tag.split("-"))
        return first, last
    return 1, store.max_id()


def feedback_source(pipeline: Pipeline):
    def _observe(store: ArtifactStore) -> DataVersion:
        return DataVersion(str(feedback_records(pipeline, store).max_id()))

    # An observable source is how Dagster gives a source a data version (what makes "unsynced" follow new
    # feedback); its beta notice is for whoever writes definitions, and would print on every load of ours.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BetaWarning)
        return observable_source_asset(
            key=key(pipeline, "chat_feedback"),
            group_name=retraining_group(pipeline),
            description="Ratings and edits collected while chatting (append-only SQLite), or the human assessments "
            "on an MLflow experiment's traces (feedback.source.mlflow_experiment). Its data version is the newest "
            "record id, so it changes with new feedback.",
        )(_observe)


def feedback_range(
    context, store: ArtifactStore, pipeline: Pipeline, tracking: MLflowTracking | None = None
) -> FeedbackRange:
    """The records of this run's range (from feedback.source: the store or an experiment's traces), made into
    each objective's train and held-out rows."""
    feedback = feedback_records(pipeline, store, tracking)
    first, last = record_range(context, feedback)
    records = feedback.records(after_id=first - 1, up_to_id=last)
    return FeedbackRange.of(records, first, last, pipeline.feedback.gate.held_out_frac, pipeline.feedback.pii)


def feedback_dataset(pipeline: Pipeline, objective: Objective):
    name = objective.dataset

    @asset(
        key=key(pipeline, name),
        group_name=retraining_group(pipeline),
        kinds={"dataset"},
        deps=[key(pipeline, "chat_feedback")],
        output_required=False,
        description=objective.about
        + " Whole conversations are held out (gate.held_out_frac) for the promotion gate. Outside a "
        'retraining run ("Materialize all") it is skipped, with the reason in the run\'s log, while '
        "there is no feedback to retrain on: the retraining after it is skipped too.",
    )
    def _dataset(context, store: ArtifactStore, tracking: MLflowTracking) -> Iterator[Output[str]]:
        taste_rewards(pipeline)  # a broken taste fails here, before anything trains
        found = feedback_range(context, store, pipeline, tracking)
        first, last = found.first, found.last
        n_skipped = sum(found.skipped.values())
        if n_skipped:
            context.log.warning(
                f"skipped {n_skipped} of {len(found.records)} feedback records in {first}-{last}: "
                + "; ".join(f"{n} {SKIP_REASONS[why]} ({why})" for why, n in found.skipped.items())
            )
        nothing = found.nothing_to_train(pipeline.feedback.objectives)
        if nothing and not (context.run and context.run.tags.get(RANGE_TAG)):
            # a run nobody asked to retrain ("Materialize all" before anyone chatted, say): no output, so the
            # retraining, merge, report and promotion gate after it are skipped and the run still succeeds
            context.log.info(f"{name} skipped: {nothing.reason}")
            return
        if nothing:  # the sensor or schedule asked for this range: a failure, which their retry back-off counts
            raise Failure(description=nothing.reason)
        if pipeline.feedback.gate.min_gain is not None and not found.held_out_records:
            # the gate could only refuse, after the whole retraining: say so now
            raise Failure(
                description=f"feedback records {first}-{last} are all in one conversation: none can be "
                "held out for the promotion gate, which asks for a gain on held-out feedback "
                "(gate.min_gain); wait for more conversations, or set gate.min_gain: null"
            )
        train, held = found.rows[objective.name]
        used = found.used[objective.name]
        log_pii(context, name, found.pii)
        scrub = redactor(pipeline.feedback.pii)  # records.json keeps replies and edits: redacted as the rows are
        with store.new_artifact(pipeline.name, name, context.op_execution_context.run_id) as (tmp, final):
            tables.write_jsonl(tmp / "train.jsonl", train)
            tables.write_jsonl(tmp / "eval.jsonl", held)
            (tmp / "records.json").write_text(  # which records, and why any was skipped
                json.dumps(
                    [
                        {
                            **{k: scrub(r.get(k)) if k in ("reply", "edited") else r.get(k) for k in PROVENANCE},
                            "skipped": check_record(r),
                        }
                        for r in found.records
                    ],
                    indent=1,
                    default=str,
                )
            )
            write_manifest(
                tmp,
                FeedbackDatasetManifest(
                    kind=f"feedback_{objective.name}_dataset",
                    objective=objective.name,
                    first_id=first,
                    last_id=last,
                    records=len(found.records),
                    rows=len(train) + len(held),
                    train_rows=len(train),
                    eval_rows=len(held),
                    records_used=used,
                    held_out_records=found.held_out_records,
                    skipped_records=n_skipped,
                    skipped=found.skipped,
                    pii=found.pii,
                    dagster_run_id=context.op_execution_context.run_id,
                ),
            )
        preview = [
            {
                "prompt": row_parts.user_text(r),
                "reply": row_parts.reply_text(r),
                **({"label": "liked" if r["label"] else "disliked"} if "label" in r else {}),
            }
            for r in train[:5]
        ]
        yield Output(
            str(final),
            metadata={
                "artifact_dir": MetadataValue.path(str(final)),
                "rows": len(train) + len(held),
                "train_rows": len(train),
                "eval_rows": len(held),
                "records": len(found.records),
                "records_used": len(used),
                "skipped_records": n_skipped,
                "skipped_by_reason": MetadataValue.json(found.skipped),
                "feedback_up_to": last,
                "feedback_range": f"{first}-{last}",
                "preview": md_table(preview),
                **pii_metadata(found.pii),
            },
        )

    return _dataset
