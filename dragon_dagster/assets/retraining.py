"""Retraining from chat feedback: the feedback store as an observable source, three datasets made from it (liked
and edited replies, pairs, ratings without a pair), a job that continues from the deployed model (SFT, DPO, KTO,
each skipped when it is off or has no records; merge; report) and the asset check that gates promotion of the
retrained model: better on held-out feedback conversations, not worse on the pipeline's task. The sensor and
schedule that request it are in automation.py.

A record that cannot be used (turns not JSON or malformed, no user turn, an edit without text) is skipped and
counted in the dataset's metadata and manifest; it never fails the range it is in.
"""

import json
import warnings
from collections.abc import Iterator
from pathlib import Path

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetIn,
    AssetKey,
    AssetSelection,
    BetaWarning,
    DataVersion,
    Failure,
    MetadataValue,
    Output,
    asset,
    asset_check,
    define_asset_job,
    observable_source_asset,
)

from ..engine.artifacts.manifest import (
    AdapterManifest,
    FeedbackDatasetManifest,
    MergedManifest,
    read_manifest,
    write_manifest,
)
from ..engine.config.stage import StageInput
from ..engine.data import tables as data_lib
from ..engine.data.feedback.store import FeedbackSource
from ..engine.data.feedback_rows import (
    SKIP_REASONS,
    check_record,
    feedback_prompts,
    objective_records,
    preference_pairs,
    sft_conversations,
    split_by_conversation,
    unpaired_ratings,
    usable_records,
)
from ..engine.pipeline import Pipeline
from ..engine.pipeline.retraining import TASK_TOLERANCE, FeedbackEvaluate, Gate, skill_falls
from ..engine.rewards import RewardError, RewardSet
from ..engine.stages.evaluate.checks import read_report
from ..engine.stages.merge.settings import Merge
from ..engine.train.stage import SCORER
from ..resources import ArtifactStore, MLflowTracking, TrainingResource
from .automation import PIPELINE_TAG, RANGE_TAG, feedback_records, feedback_schedule, feedback_sensor, retrain_job_name
from .builders import key, merge_asset, retraining_group
from .launchpad import effective, launchpad_config
from .live_gate import await_live, live_gate_sensor
from .metadata import md_table
from .pool import POOL_EXECUTOR, POOL_TAGS, TRAINING_POOL
from .promotion import deployed_model, promote_merged, report_merged_dir
from .prompts import PROMPT_TAG, live_system
from .report import run_report_stage
from .stage_inputs import asset_ins, by_role, declared_ins, undeclared
from .training import reward_model_inputs, run_training_stage


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


DATASETS = {
    "sft": "feedback_sft_dataset",
    "dpo": "feedback_pairs",
    "kto": "feedback_ratings",
    "rlhf": "feedback_prompts",
}
WHAT = {"sft": "liked or edited replies", "dpo": "pairs", "kto": "ratings without a pair", "rlhf": "rated prompts"}
UNITS = {"sft": "conversations", "dpo": "pairs", "kto": "rated replies", "rlhf": "prompts"}
OBJECTIVE_TAG = "dragon/feedback_{}"  # on the retraining run: what each objective trained on, or why not


def feedback_rows(context, store: ArtifactStore, pipeline: Pipeline, tracking: MLflowTracking | None = None) -> dict:
    """The records of this run's range (from feedback.source: the store or an experiment's traces), made into
    each objective's train and held-out rows. Whole conversations are held out (the gate measures on them), the
    same ones for every objective."""
    feedback = feedback_records(pipeline, store, tracking)
    first, last = record_range(context, feedback)
    records = feedback.records(after_id=first - 1, up_to_id=last)
    usable, skipped = usable_records(records)
    train, held = split_by_conversation(usable, pipeline.feedback.gate.held_out_frac)
    rows = {
        objective: (make(train), make(held))
        for objective, make in (
            (
                "sft",
                lambda rs: [data_lib.conversation_row(c["messages"], i) for i, c in enumerate(sft_conversations(rs))],
            ),
            ("dpo", preference_pairs),
            ("kto", unpaired_ratings),
            ("rlhf", feedback_prompts),
        )
    }
    return {
        "first": first,
        "last": last,
        "records": records,
        "skipped": skipped,
        "rows": rows,
        "used": objective_records(train),
        "held_out_records": len(held),
    }


def taste_rewards(pipeline: Pipeline) -> RewardSet | None:
    """The gate's taste as rewards (custom files found relative to the pipeline's YAML); a Failure naming the
    problem when one cannot be built (a missing file, say), so a retraining fails before it trains."""
    if not pipeline.feedback.gate.taste:
        return None
    base = Path(pipeline.source_file).parent if pipeline.source_file else None
    try:
        return RewardSet.from_list(pipeline.feedback.gate.taste, base_dir=base)
    except RewardError as exc:
        raise Failure(description=f"{pipeline.name} feedback.gate.taste: {exc}") from exc


def taste_model_stages(pipeline: Pipeline) -> list[str]:
    """The reward-model stages the gate's taste names (rlhf's feedback_reward_model)."""
    return list(dict.fromkeys(r.stage for r in pipeline.feedback.gate.taste or [] if r.type == "reward_model"))


def feedback_dataset(pipeline: Pipeline, objective: str):
    name = DATASETS[objective]

    @asset(
        key=key(pipeline, name),
        group_name=retraining_group(pipeline),
        kinds={"dataset"},
        deps=[key(pipeline, "chat_feedback")],
        output_required=False,
        description={
            "sft": "Liked or edited replies with the turns before them, as conversations (an edit replaces the reply).",
            "dpo": "Preference pairs: an edit against its original, a liked or edited reply against a "
            "disliked one to the same turns.",
            "kto": "Thumbs up or down on replies to turns that give no pair (no edit, no opposite "
            "verdict), as rated replies for KTO.",
            "rlhf": "The turns people rated a reply to, as prompts: GRPO samples fresh replies to them, which the "
            "feedback reward model scores (rlhf).",
        }[objective]
        + " Whole conversations are held out (gate.held_out_frac) for the promotion gate. Outside a "
        'retraining run ("Materialize all") it is skipped, with the reason in the run\'s log, while '
        "there is no feedback to retrain on: the retraining after it is skipped too.",
    )
    def _dataset(context, store: ArtifactStore, tracking: MLflowTracking) -> Iterator[Output[str]]:
        taste_rewards(pipeline)  # a broken taste fails here, before anything trains
        found = feedback_rows(context, store, pipeline, tracking)
        first, last, records, skipped = found["first"], found["last"], found["records"], found["skipped"]
        n_skipped = sum(skipped.values())
        if n_skipped:
            context.log.warning(
                f"skipped {n_skipped} of {len(records)} feedback records in {first}-{last}: "
                + "; ".join(f"{n} {SKIP_REASONS[why]} ({why})" for why, n in skipped.items())
            )
        reason = nothing_to_train(pipeline, found)
        if reason and not (context.run and context.run.tags.get(RANGE_TAG)):
            # a run nobody asked to retrain ("Materialize all" before anyone chatted, say): no output, so the
            # retraining, merge, report and promotion gate after it are skipped and the run still succeeds
            context.log.info(f"{name} skipped: {reason}")
            return
        if reason:  # the sensor or schedule asked for this range: a failure, which their retry back-off counts
            raise Failure(description=reason)
        if pipeline.feedback.gate.min_gain is not None and not found["held_out_records"]:
            # the gate could only refuse, after the whole retraining: say so now
            raise Failure(
                description=f"feedback records {first}-{last} are all in one conversation: none can be "
                "held out for the promotion gate, which asks for a gain on held-out feedback "
                "(gate.min_gain); wait for more conversations, or set gate.min_gain: null"
            )
        train, held = found["rows"][objective]
        with store.new_artifact(pipeline.name, name, context.op_execution_context.run_id) as (tmp, final):
            data_lib.write_jsonl(tmp / "train.jsonl", train)
            data_lib.write_jsonl(tmp / "eval.jsonl", held)
            # which records, and why any was skipped; the turns stay in the store (turns_id), not copied here
            (tmp / "records.json").write_text(
                json.dumps(
                    [
                        {
                            **{
                                k: r.get(k)
                                for k in (
                                    "id",
                                    "conversation_id",
                                    "turns_id",
                                    "verdict",
                                    "reply",
                                    "edited",
                                    "model",
                                    "created",
                                    "trace_id",
                                )
                            },
                            "skipped": check_record(r),
                        }
                        for r in records
                    ],
                    indent=1,
                    default=str,
                )
            )
            write_manifest(
                tmp,
                FeedbackDatasetManifest(
                    kind=f"feedback_{objective}_dataset",
                    objective=objective,
                    first_id=first,
                    last_id=last,
                    records=len(records),
                    rows=len(train) + len(held),
                    train_rows=len(train),
                    eval_rows=len(held),
                    records_used=found["used"][objective],
                    held_out_records=found["held_out_records"],
                    skipped_records=n_skipped,
                    skipped=skipped,
                    dagster_run_id=context.op_execution_context.run_id,
                ),
            )
        preview = [
            {
                "prompt": data_lib.user_text(r),
                "reply": data_lib.reply_text(r),
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
                "records": len(records),
                "records_used": len(found["used"][objective]),
                "skipped_records": n_skipped,
                "skipped_by_reason": MetadataValue.json(skipped),
                "feedback_up_to": last,
                "feedback_range": f"{first}-{last}",
                "preview": md_table(preview),
            },
        )

    return _dataset


def nothing_to_train(pipeline: Pipeline, found: dict) -> str | None:
    """Why the records give no objective the retraining runs anything to train on; None when one has rows."""
    objectives = pipeline.feedback.objectives
    if any(found["rows"][o][0] for o in objectives):
        return None
    first, last, n_records = found["first"], found["last"], len(found["records"])
    if n_records == 0:
        return (
            f"no feedback records yet (range {first}-{last}); rate or edit replies in the chat, and the feedback "
            f"sensor or schedule requests retraining"
        )
    return (
        f"nothing to retrain on in feedback records {first}-{last} ({n_records} records, "
        f"{sum(found['skipped'].values())} skipped as unusable: {found['skipped']}, "
        f"{found['held_out_records']} held out for the gate): no "
        + " and no ".join(WHAT[o] for o in objectives)
        + " to train "
        + ", ".join(objectives)
        + " on"
    )


def skip_reason(pipeline: Pipeline, objective: str, train_rows: int, what: str | None = None) -> str | None:
    """Why a feedback objective does not train (off, or nothing to train on); None when it does."""
    if objective not in pipeline.feedback.objectives:
        return "off (feedback.objectives)"
    return None if train_rows else f"no {what or WHAT[objective]}"


def retrain_stage(pipeline: Pipeline, stage, objective: str, after: str | None):
    """A feedback objective's adapter: continues from the stage before it (or the deployed model when none ran),
    and passes the chain on unchanged when its objective is off or it has no training rows. A stage scored by a
    reward model (rlhf's GRPO) reads that model too, and is skipped when it was (no pairs to learn a taste from).
    A stage out of the chain (the reward model) gives "" when skipped."""
    ins = {"data": AssetIn(key=key(pipeline, stage.dataset))}
    if after:
        ins["previous"] = AssetIn(key=key(pipeline, after))
    declared = declared_ins(pipeline, stage)
    ins.update(asset_ins(declared))
    what = "pairs to learn a taste from" if not stage.in_chain else None

    @asset(
        key=key(pipeline, stage.name),
        group_name=retraining_group(pipeline),
        kinds={"pytorch", "mlflow"},
        ins=ins,
        pool=TRAINING_POOL,
        op_tags=POOL_TAGS,
        description=(
            f"{stage.kind.upper()} on the feedback's {what or WHAT[objective]}"
            + (f", scored by {', '.join(stage.scorers())}" if stage.scorers() else "")
            + ", continuing from "
            + (f"{after} (or the deployed model when nothing ran before)" if after else "the deployed model")
            + ". Passes the chain on unchanged when the objective is off or has no rows; the run's tag "
            f"{OBJECTIVE_TAG.format(objective)} says which."
            if stage.in_chain
            else f"The {objective} objective's reward model, trained on the feedback pairs from the deployed model; "
            "skipped (an empty output) when the objective is off or there are no pairs."
        ),
    )
    def _train(
        context,
        config: launchpad_config(stage),
        store: ArtifactStore,
        tracking: MLflowTracking,
        training: TrainingResource,
        **inputs,
    ) -> Output[str]:
        data = str(store.local(inputs["data"]))
        previous = str(store.local(inputs["previous"])) if inputs.get("previous") else ""  # "": nothing ran yet
        manifest = read_manifest(data, FeedbackDatasetManifest)
        rows, records = manifest.train_rows, len(manifest.records_used)
        skipped = skip_reason(pipeline, objective, rows, what)
        scorers = {n: str(store.local(p)) if p else "" for n, p in by_role(declared, inputs).get(SCORER, {}).items()}
        if not skipped and not all(scorers.values()):
            skipped = f"no reward model ({', '.join(n for n, p in scorers.items() if not p)} was skipped)"
        tag = f"skipped: {skipped}" if skipped else f"{rows} rows from {records} records"
        tag_name = OBJECTIVE_TAG.format(objective if stage.in_chain else stage.name)
        context.instance.add_run_tags(context.op_execution_context.run_id, {tag_name: tag})
        if skipped:
            context.log.info(f"{stage.name}: {skipped}" + ("; the chain goes on unchanged" if stage.in_chain else ""))
            return Output(
                previous,
                metadata={
                    "skipped": MetadataValue.text(skipped),
                    **({"artifact_dir": MetadataValue.path(previous)} if previous else {}),
                },
            )
        # the deployed model, also when an earlier objective ran: the chain continues from its adapters
        start = (
            read_manifest(previous, AdapterManifest).resolved_model
            if previous
            else str(deployed_model(tracking, store, pipeline))
        )
        return run_training_stage(
            context,
            pipeline,
            effective(stage, config),
            data,
            previous or None,
            False,
            store,
            tracking,
            training,
            start_model=start,
            tags={
                # the version chat sent when this retraining ran (each conversation holds the text it was sent)
                PROMPT_TAG: live_system(pipeline, tracking, pipeline.system_prompt())[1],
                "feedback_range": context.run.tags.get(RANGE_TAG),
                "objective": objective,
                "feedback_rows": rows,
                "feedback_records": records,
            },
            declared={SCORER: scorers},
        )

    return _train


def objectives_summary(pipeline: Pipeline, data: dict[str, str], chain: list[str]) -> list[dict]:
    """For the report: each objective, whether it ran, on how many rows from how many records, or why not."""
    ran = {read_manifest(Path(a).parent, AdapterManifest).stage for a in chain}
    out = []
    for objective, stage in (
        ("sft", pipeline.feedback.sft),
        ("dpo", pipeline.feedback.dpo),
        ("kto", pipeline.feedback.kto),
        ("rlhf", pipeline.feedback.rlhf),
    ):
        if objective not in data:
            continue
        manifest = read_manifest(data[objective], FeedbackDatasetManifest)
        skipped = skip_reason(pipeline, objective, manifest.train_rows)
        out.append(
            {
                "objective": objective,
                "stage": stage.name,
                "ran": stage.name in ran,
                "rows": manifest.train_rows,
                "unit": UNITS[objective],
                "records": len(manifest.records_used),
                "held_out_rows": manifest.eval_rows,
                "skipped": skipped,
            }
        )
    return out


def retrained_report(pipeline: Pipeline, stage: FeedbackEvaluate):
    # the reward models of a learned taste, declared as the training stages' scorers are
    declared = {
        f"{SCORER}_{name}": (StageInput(SCORER, name), AssetIn(key=key(pipeline, name)))
        for name in taste_model_stages(pipeline)
    }
    ins = {
        "merged": AssetIn(key=key(pipeline, "retrained_model")),
        "dataset": AssetIn(key=key(pipeline, stage.dataset)),
        **{objective: AssetIn(key=key(pipeline, name)) for objective, name in DATASETS.items()},
        **asset_ins(declared),
    }

    @asset(
        key=key(pipeline, stage.name),
        group_name=retraining_group(pipeline),
        kinds={"mlflow"},
        ins=ins,
        pool=TRAINING_POOL,
        op_tags=POOL_TAGS,
        description="The model the retraining started from against the retrained one: task loss and metrics on "
        f"{stage.dataset}'s held-out rows, and the held-out feedback figures the promotion gate "
        "reads (reward, pair accuracy, liked share); which objectives ran, on how much.",
    )
    def _report(
        context,
        config: launchpad_config(stage),
        store: ArtifactStore,
        tracking: MLflowTracking,
        training: TrainingResource,
        merged: str,
        dataset: str,
        **inputs: str,
    ) -> Output[str]:
        data = {o: str(store.local(d)) for o, d in undeclared(declared, inputs).items()}
        scorers = by_role(declared, inputs).get(SCORER, {})
        merged = str(store.local(merged))
        gate = pipeline.feedback.gate
        feedback = {
            "held_out": {o: Path(d) / "eval.jsonl" for o, d in data.items()},
            "liked_at": gate.liked_at,
            "objectives": objectives_summary(pipeline, data, read_manifest(merged, MergedManifest).adapters),
        }
        if gate.taste:  # custom taste files travel with the report, so it reproduces
            feedback["taste"] = taste_rewards(pipeline)
            missing = [n for n, p in scorers.items() if not p]  # a reward model skipped (no pairs): its taste goes
            if missing:
                context.log.warning(
                    f"the taste's reward model {missing} was skipped (no pairs): liked_share without it"
                )
                kept = [r for r in feedback["taste"] if getattr(r, "stage", None) not in missing]
                feedback["taste"] = RewardSet(kept) if kept else None
            feedback["reward_models"] = (
                reward_model_inputs(
                    [n for n, p in scorers.items() if p],
                    {n: str(store.local(p)) for n, p in scorers.items() if p},
                    stage.name,
                )
                if feedback["taste"] is not None and any(scorers.values())
                else []
            )
        return run_report_stage(
            context,
            pipeline,
            effective(stage, config),
            merged,
            str(store.local(dataset)),
            store,
            tracking,
            training,
            feedback=feedback,
        )

    return _report


def promotion_check(pipeline: Pipeline, report_key: AssetKey):
    gate = pipeline.feedback.gate if pipeline.feedback else Gate()

    @asset_check(
        asset=report_key,
        name="promotion_gate",
        blocking=True,
        description=(
            f"The retrained model beats the model it started from on the held-out feedback "
            f"({gate.metric} gain above {gate.min_gain})"
            if gate.min_gain is not None
            else "The retrained model is not worse than the model it started from"
        )
        + " and not worse on the pipeline's held-out task loss and metrics, has lost no more than "
        f"{gate.skills_tolerance:g} on a general-skill task (feedback.evaluate.skills), and that model is "
        "still the champion; passing makes it the champion in the MLflow Model Registry (the "
        "model chat and the next retraining use)"
        + (
            f", once live ratings agree (gate.live: the live gate sensor promotes it when it and the champion have "
            f"{gate.live.min_ratings} ratings each from dragon serve and a one-sided Fisher exact test at "
            f"{gate.live.alpha:g} does not say it is liked less)."
            if gate.live
            else "."
        ),
    )
    def _gate(context, store: ArtifactStore, tracking: MLflowTracking) -> AssetCheckResult:
        event = context.instance.get_latest_materialization_event(report_key)
        report_dir = Path(event.asset_materialization.metadata["artifact_dir"].value)
        report = read_report(report_dir)
        merged_dir = report_merged_dir(report_dir)
        worse = regressions(report.base, report.merged, gate.task_tolerance)
        short, deciding = gain_decision(report.feedback, gate)
        started_from = read_manifest(merged_dir, MergedManifest).resolved_model
        live = deployed_model(tracking, store, pipeline) if started_from else None
        if started_from and Path(started_from) != live:
            # compared with a model that is no longer live (a rollback or a new pipeline model meanwhile)
            worse.append(f"champion moved during the retraining (started from {started_from}, now {live})")
        fell = skill_falls(report.skills, gate.skills_tolerance)
        problems = (
            [
                f"{name} worse than the starting model beyond its task_tolerance"
                if name in gate.task_tolerance
                else name
                for name in worse
            ]
            + list(fell.values())
            + short
        )
        promoted = {}
        reason = f"{report_key.to_user_string()}: promotion_gate passed"
        if not problems:
            promoted = (
                await_live(context, pipeline, tracking, store, merged_dir, reason)
                if gate.live
                else promote_merged(context, pipeline.name, tracking, merged_dir, reason)
            )
        passed = (
            (f"{gate.metric} gain above {gate.min_gain}" if gate.min_gain is not None else "not worse")
            + " and no task regression"
            + (" nor general-skill loss" if report.skills else "")
        )
        return AssetCheckResult(
            passed=not problems,
            severity=AssetCheckSeverity.ERROR,
            metadata={
                "decision": MetadataValue.text(
                    "; ".join(problems)
                    or (
                        f"passed: {passed}; {promoted['live_gate']}"
                        if gate.live and promoted.get("live_gate", "").startswith("waiting")
                        else f"promoted: {passed}"
                    )
                ),
                "regressions": ", ".join(worse) or "none",
                **deciding,
                "start_eval_loss": report.base["eval_loss"],
                "retrained_eval_loss": report.merged["eval_loss"],
                **{f"start/{k}": v for k, v in report.base.get("metrics", {}).items()},
                **{f"retrained/{k}": v for k, v in report.merged.get("metrics", {}).items()},
                **skill_figures(report.skills),
                **({"skills_fell": ", ".join(fell) or "none"} if report.skills else {}),
                **promoted,
            },
        )

    return _gate


def skill_figures(skills: dict | None) -> dict:
    """The gate's metadata on general skills: each task's score, starting against retrained."""
    if not skills:
        return {}
    out = {}
    for c in skills["changes"]:
        out[f"start/skills/{c['task']}"] = c["base"]
        out[f"retrained/skills/{c['task']}"] = c["merged"]
    return out


def gain_decision(feedback: dict | None, gate: Gate) -> tuple[list[str], dict]:
    """(why the held-out feedback gain falls short, empty when it does not; the figures that decided it)."""
    figures = (feedback or {}).get(gate.metric)
    held = (feedback or {}).get("held_out", {})
    deciding = {
        "gate_metric": gate.metric,
        "min_gain": gate.min_gain if gate.min_gain is not None else "none",
        "held_out_feedback": MetadataValue.json(held),
    }
    if figures:
        deciding.update(
            {
                f"feedback/{gate.metric}_start": figures["start"],
                f"feedback/{gate.metric}_retrained": figures["retrained"],
                f"feedback/{gate.metric}_gain": figures["gain"],
            }
        )
    if gate.min_gain is None:  # "not worse" alone: a measured loss on the held-out feedback still counts
        if figures and figures["gain"] < 0:
            return [f"{gate.metric} fell by {-figures['gain']:.4g} on the held-out feedback"], deciding
        return [], deciding
    if not figures:
        return [
            f"no held-out feedback to measure {gate.metric} on ({held or 'none'}); hold out more "
            f"(gate.held_out_frac), collect more feedback, or set gate.min_gain: null to promote on 'not worse' "
            "alone"
        ], deciding
    if not figures["gain"] > gate.min_gain:
        return [
            f"{gate.metric} gain {figures['gain']:.4g} is not above min_gain {gate.min_gain:g} on the held-out feedback"
        ], deciding
    return [], deciding


def regressions(start: dict, retrained: dict, tolerance: dict[str, float] | None = None) -> list[str]:
    """Task figures where the retrained model is worse than where it started, beyond each one's tolerance."""
    tolerance = TASK_TOLERANCE if tolerance is None else tolerance
    worse = []
    if "eval_loss" in tolerance and retrained["eval_loss"] > start["eval_loss"] + tolerance["eval_loss"]:
        worse.append("eval_loss")
    for name, allowed in tolerance.items():
        if (
            name != "eval_loss"
            and name in start.get("metrics", {})
            and retrained["metrics"].get(name, 0) < start["metrics"][name] - allowed
        ):
            worse.append(name)
    return worse


def build_feedback_defs(pipeline: Pipeline) -> dict:
    """Everything the feedback loop adds to a pipeline with a `feedback:` section."""
    settings = pipeline.feedback
    merge = Merge(name="retrained_model", kind="merge")
    assets = [
        feedback_source(pipeline),
        *(feedback_dataset(pipeline, o) for o in DATASETS),
        retrain_stage(pipeline, settings.sft, "sft", after=None),
        retrain_stage(pipeline, settings.dpo, "dpo", after=settings.sft.name),
        retrain_stage(pipeline, settings.kto, "kto", after=settings.dpo.name),
        retrain_stage(pipeline, settings.reward_model, "rlhf", after=None),
        retrain_stage(pipeline, settings.rlhf, "rlhf", after=settings.kto.name),
        merge_asset(pipeline, merge, upstream=[settings.rlhf.name], group=retraining_group(pipeline)),
        retrained_report(pipeline, settings.evaluate),
    ]
    names = [
        *DATASETS.values(),
        settings.sft.name,
        settings.dpo.name,
        settings.kto.name,
        settings.reward_model.name,
        settings.rlhf.name,
        merge.name,
        settings.evaluate.name,
    ]
    job = define_asset_job(
        retrain_job_name(pipeline),
        selection=AssetSelection.assets(*[key(pipeline, n) for n in names]),
        description="Retrain the deployed model on chat feedback.",
        run_tags={PIPELINE_TAG: pipeline.name},
        executor_def=POOL_EXECUTOR,
    )
    return {
        "assets": assets,
        "asset_checks": [promotion_check(pipeline, key(pipeline, settings.evaluate.name))],
        "jobs": [job],
        "sensors": [
            feedback_sensor(pipeline, settings.min_new_records, job),
            *([live_gate_sensor(pipeline)] if settings.gate.live else []),
        ],
        "schedules": [feedback_schedule(pipeline, settings.cron, job)],
    }
