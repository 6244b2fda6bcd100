"""The evaluation report asset's work: run the evaluate job, log base and merged figures to MLflow."""

from __future__ import annotations

import shutil
from pathlib import Path

from dagster import MetadataValue, Output

from ..engine import catalog
from ..engine.artifacts.manifest import AdapterManifest, MergedManifest, ReportManifest, read_manifest, write_manifest
from ..engine.pipeline import Pipeline
from ..engine.rewards import RewardSet
from ..engine.stages.evaluate.inputs import ChainStage, FeedbackInputs, ReportInputs
from ..engine.stages.evaluate.result import ReportResult
from ..engine.stages.evaluate.settings import Evaluate
from .metadata import as_metadata
from .sweep_tags import sweep_tags_of


def chain_of(merged: MergedManifest) -> list[ChainStage]:
    """The merged model's adapter stages, as their manifests describe them (figures, loss curve, rewards)."""
    out = []
    for adapter in merged.adapters:
        manifest = read_manifest(Path(adapter).parent, AdapterManifest)
        result = manifest.result
        out.append(
            ChainStage(
                name=manifest.stage,
                dir=str(Path(adapter).parent),
                objective=result.objective or manifest.method,
                loss_label=result.loss_label,
                figures=result.figures,
                rewards=result.rewards,
            )
        )
    return out


def run_report_stage(
    context,
    pipeline: Pipeline,
    stage: Evaluate,
    merged: str,
    dataset: str,
    store,
    tracking,
    training,
    feedback: dict | None = None,
) -> Output[str]:
    """stage: the effective settings (YAML, defaults and this run's config). feedback: a retraining's held-out
    feedback files, objectives and taste (a RewardSet), for the gate's figures."""
    settings = stage.model_dump()
    merged_manifest = read_manifest(merged, MergedManifest)
    first_stage = merged_manifest.adapters[:1] if len(merged_manifest.adapters) > 1 else []
    with store.new_artifact(pipeline.name, stage.name, context.op_execution_context.run_id) as (tmp, final):
        feedback_inputs = None
        if feedback:  # the held-out feedback and taste files travel with the report (and to a remote worker)
            (tmp / "feedback").mkdir()
            held_out = {}
            for objective, path in feedback["held_out"].items():
                shutil.copyfile(path, tmp / "feedback" / f"{objective}.jsonl")
                held_out[objective] = str(tmp / "feedback" / f"{objective}.jsonl")
            taste: RewardSet | None = feedback.get("taste")
            feedback_inputs = FeedbackInputs(
                held_out=held_out,
                taste=taste.localize(tmp).to_list(relative_to=tmp) if taste else None,
                liked_at=feedback["liked_at"],
                objectives=feedback["objectives"],
            )
        job = catalog.kind_of(stage).job_model()(
            settings=stage,
            inputs=ReportInputs(
                base_model=merged_manifest.resolved_model,
                merged_model=merged_manifest.info.model_dir,
                eval_file=str(Path(dataset) / "eval.jsonl"),
                train_file=str(Path(dataset) / "train.jsonl"),
                chain=chain_of(merged_manifest),
                first_stage_adapters=first_stage,
                feedback=feedback_inputs,
            ),
            output_dir=str(tmp),
        )
        report: ReportResult = training.run_job(context, job, tmp, env=tracking.env(), store=store, final=final)
        tags = {
            "pipeline": pipeline.name,
            "asset_key": context.asset_key.to_user_string(),
            "dagster_run_id": context.op_execution_context.run_id,
            "base_model": pipeline.model,
            **sweep_tags_of(context.run.tags),  # a sweep's point: which sweep, which point, its settings
        }
        base_run = tracking.start_run(
            pipeline.name, "base", {**tags, "stage": "base"}, {"model": pipeline.model, "rows": report.rows}
        )
        tracking.log_metrics(base_run, report.base_metrics())
        tracking.end_run(base_run)
        report_run = tracking.start_run(
            pipeline.name,
            stage.name,
            {
                **tags,
                "stage": stage.name,
                "upstream_mlflow_run_id": merged_manifest.upstream_mlflow_run_id,
                "base_mlflow_run_id": base_run,
            },
            {"model": pipeline.model, "merged": merged, **settings},
        )
        tracking.log_metrics(report_run, report.run_metrics())
        tracking.log_artifacts(report_run, [tmp / "report.md", tmp / "report.json", tmp / "loss.png"])
        tracking.end_run(report_run)
        write_manifest(
            tmp,
            ReportManifest(
                merged=merged,
                dataset=dataset,
                settings=settings,
                mlflow_run_id=report_run,
                base_mlflow_run_id=base_run,
                dagster_run_id=context.op_execution_context.run_id,
            ),
        )
    metadata = {
        "artifact_dir": MetadataValue.path(str(final)),
        "report": MetadataValue.md((final / "report.md").read_text()),
        "mlflow_run": MetadataValue.url(tracking.run_url(pipeline.name, report_run)),
        **as_metadata(report.metadata()),
    }
    return Output(str(final), metadata=metadata)
