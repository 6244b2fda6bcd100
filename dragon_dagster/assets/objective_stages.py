"""The training stages of a retraining's objectives (engine/pipeline/objectives.py), as assets: each continues
the chain of adapters from the stage before it (or from the deployed model when none ran), and an objective that
is off or has nothing to train on is `Skipped`: its asset passes the chain on unchanged (None when nothing ran
yet), so the objectives after it still train, and says why in its metadata and in a tag on the run."""

from dagster import AssetIn, Failure, MetadataValue, Output, asset

from ..engine.artifacts.manifest import AdapterManifest, FeedbackDatasetManifest, read_manifest
from ..engine.pipeline import Pipeline
from ..engine.pipeline.objectives import Objective, Skipped
from ..engine.train.stage import SCORER, TrainerStage
from ..resources import ArtifactStore, MLflowTracking, TrainingResource
from .asset_wiring import key, retraining_group
from .automation import RANGE_TAG
from .launchpad import effective, launchpad_config
from .pool import POOL_TAGS, TRAINING_POOL
from .promotion import deployed_model
from .prompts import PROMPT_TAG, live_system
from .stage_inputs import asset_ins, by_role, declared_ins
from .training import run_training_stage

OBJECTIVE_TAG = "dragon/feedback_{}"  # on the retraining run: what each objective trained on, or why not


def objective_stage(
    pipeline: Pipeline, stage: TrainerStage, objective: Objective, after: str | None, last: bool = False
):
    """A stage of an objective: in the chain, its adapter (continuing from `after`, the chain's stage before
    it); out of it, a model a chain stage reads (rlhf's reward model, which GRPO is scored by), whose output is
    None when skipped. A stage scored by a reward model is skipped when that model was. `last`: the chain's
    last stage, whose output the merge folds, so it fails when no stage of the chain trained."""
    ins = {"data": AssetIn(key=key(pipeline, stage.dataset))}
    if after:
        ins["previous"] = AssetIn(key=key(pipeline, after))
    declared = declared_ins(pipeline, stage)
    ins.update(asset_ins(declared))
    what = objective.what if stage.in_chain else objective.helper_needs

    @asset(
        key=key(pipeline, stage.name),
        group_name=retraining_group(pipeline),
        kinds={"pytorch", "mlflow"},
        ins=ins,
        pool=TRAINING_POOL,
        op_tags=POOL_TAGS,
        description=(
            f"{stage.kind.upper()} on the feedback's {what}"
            + (f", scored by {', '.join(stage.scorers())}" if stage.scorers() else "")
            + ", continuing from "
            + (f"{after} (or the deployed model when nothing ran before)" if after else "the deployed model")
            + ". Passes the chain on unchanged when the objective is off or has no rows; the run's tag "
            f"{OBJECTIVE_TAG.format(objective.name)} says which."
            if stage.in_chain
            else f"The {objective.name} objective's reward model, trained on the feedback pairs from the deployed "
            "model; skipped (no artifact) when the objective is off or there are no pairs."
        ),
    )
    def _train(
        context,
        config: launchpad_config(stage),
        store: ArtifactStore,
        tracking: MLflowTracking,
        training: TrainingResource,
        **inputs,
    ) -> Output[str | None]:
        data = str(store.local(inputs["data"]))
        previous = str(store.local(inputs["previous"])) if inputs.get("previous") else None  # None: nothing ran yet
        manifest = read_manifest(data, FeedbackDatasetManifest)
        rows, records = manifest.train_rows, len(manifest.records_used)
        scorers = {n: str(store.local(p)) if p else None for n, p in by_role(declared, inputs).get(SCORER, {}).items()}
        skipped = objective.skipped(pipeline.feedback.objectives, rows, stage.in_chain)
        if not skipped and None in scorers.values():
            skipped = Skipped(f"no reward model ({', '.join(n for n, p in scorers.items() if p is None)} was skipped)")
        tag = f"skipped: {skipped.reason}" if skipped else f"{rows} rows from {records} records"
        tag_name = OBJECTIVE_TAG.format(objective.name if stage.in_chain else stage.name)
        context.instance.add_run_tags(context.op_execution_context.run_id, {tag_name: tag})
        if skipped:
            return passed_on(context, stage, previous, skipped, last)
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
            previous,
            False,
            store,
            tracking,
            training,
            start_model=start,
            tags={
                # the version chat sent when this retraining ran (each conversation holds the text it was sent)
                PROMPT_TAG: live_system(pipeline, tracking, pipeline.system_prompt())[1],
                "feedback_range": context.run.tags.get(RANGE_TAG),
                "objective": objective.name,
                "feedback_rows": rows,
                "feedback_records": records,
            },
            declared={SCORER: scorers},
        )

    return _train


def passed_on(context, stage: TrainerStage, previous: str | None, skipped: Skipped, last: bool) -> Output[str | None]:
    """A skipped stage's output: the chain as it came (None when nothing ran yet), with the reason."""
    if last and previous is None:
        raise Failure(
            description=f"{stage.name}: {skipped.reason}, and no objective before it trained: there is no adapter "
            "to merge; give the retraining feedback one of feedback.objectives can train on, or list more of them"
        )
    context.log.info(f"{stage.name}: {skipped.reason}" + ("; the chain goes on unchanged" if stage.in_chain else ""))
    return Output(
        previous,
        metadata={
            "skipped": MetadataValue.text(skipped.reason),
            **({"artifact_dir": MetadataValue.path(previous)} if previous else {}),
        },
    )
