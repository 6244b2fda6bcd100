"""The retrained report: the model a retraining started from against the retrained one, on the pipeline's
held-out task rows and the held-out feedback (the figures the promotion gate reads), with which objectives ran,
on how much, or why not."""

from pathlib import Path

from dagster import AssetIn, Output, asset

from ..engine.artifacts.manifest import AdapterManifest, FeedbackDatasetManifest, MergedManifest, read_manifest
from ..engine.config.stage import StageInput
from ..engine.pipeline import Pipeline
from ..engine.pipeline.objectives import OBJECTIVES
from ..engine.pipeline.retraining import FeedbackEvaluate
from ..engine.rewards import RewardSet
from ..engine.train.stage import SCORER
from ..resources import ArtifactStore, MLflowTracking, TrainingResource
from .asset_wiring import key, retraining_group
from .feedback_taste import taste_model_stages, taste_rewards
from .launchpad import effective, launchpad_config
from .pool import POOL_TAGS, TRAINING_POOL
from .report import run_report_stage
from .stage_inputs import asset_ins, by_role, undeclared
from .training import reward_model_inputs


def objectives_summary(pipeline: Pipeline, data: dict[str, str], chain: list[str]) -> list[dict]:
    """For the report: each objective, whether it ran, on how many rows from how many records, or why not."""
    ran = {read_manifest(Path(a).parent, AdapterManifest).stage for a in chain}
    out = []
    for objective in OBJECTIVES:
        if objective.name not in data:
            continue
        stage = pipeline.feedback.trained_by(objective)[-1]
        manifest = read_manifest(data[objective.name], FeedbackDatasetManifest)
        skipped = objective.skipped(pipeline.feedback.objectives, manifest.train_rows)
        out.append(
            {
                "objective": objective.name,
                "stage": stage.name,
                "ran": stage.name in ran,
                "rows": manifest.train_rows,
                "unit": objective.unit,
                "records": len(manifest.records_used),
                "held_out_rows": manifest.eval_rows,
                "skipped": skipped.reason if skipped else None,
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
        **{o.name: AssetIn(key=key(pipeline, o.dataset)) for o in OBJECTIVES},
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
        **inputs: str | None,  # None: a reward model of the taste that was skipped
    ) -> Output[str]:
        data = {o: str(store.local(d)) for o, d in undeclared(declared, inputs).items()}
        scorers = by_role(declared, inputs).get(SCORER, {})  # None: the reward model was skipped (no pairs)
        merged = str(store.local(merged))
        gate = pipeline.feedback.gate
        feedback = {
            "held_out": {o: Path(d) / "eval.jsonl" for o, d in data.items()},
            "liked_at": gate.liked_at,
            "objectives": objectives_summary(pipeline, data, read_manifest(merged, MergedManifest).adapters),
        }
        if gate.taste:  # custom taste files travel with the report, so it reproduces
            feedback["taste"] = taste_rewards(pipeline)
            missing = [n for n, p in scorers.items() if p is None]  # a reward model skipped: its taste goes
            if missing:
                context.log.warning(
                    f"the taste's reward model {missing} was skipped (no pairs): liked_share without it"
                )
                kept = [r for r in feedback["taste"] if getattr(r, "stage", None) not in missing]
                feedback["taste"] = RewardSet(kept) if kept else None
            trained = {n: str(store.local(p)) for n, p in scorers.items() if p is not None}
            feedback["reward_models"] = (
                reward_model_inputs(list(trained), trained, stage.name)
                if feedback["taste"] is not None and trained
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
