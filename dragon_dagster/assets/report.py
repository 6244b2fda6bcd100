"""The evaluation report asset's work: run the evaluate job, log base and merged figures to MLflow."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from dagster import MetadataValue, Output

from ..engine import catalog
from ..engine.artifacts.manifest import AdapterManifest, MergedManifest, ReportManifest, read_manifest, write_manifest
from ..engine.evaluate.plots import plot_chain
from ..engine.pipeline import Pipeline
from ..engine.release.model_registry import version_for
from ..engine.rewards import RewardSet
from ..engine.stages.evaluate.inputs import ChainStage, FeedbackInputs, ReportInputs
from ..engine.stages.evaluate.result import ReportResult
from ..engine.stages.evaluate.settings import Evaluate
from ..resources.evaluations import log_evaluation, record_evaluation
from ..resources.run_colours import colour_tag
from .metadata import as_metadata, image_markdown
from .mlflow_runs import PROFILE_TAG, stage_source
from .prompts import PROMPT_TAG, live_system, rows_with_system
from .stage_runs import stage_runs
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
                pass_at_k=result.pass_at_k,
                temperature=result.temperature,
            )
        )
    return out


def json_figures(figures: dict) -> str:
    import json

    return json.dumps(figures, indent=2, default=str)


CHAIN_IMAGE = "chain/heldout_nll"  # the first section of MLflow's chart view ("chain" sorts before "eval")


def log_held_out(
    context,
    pipeline: Pipeline,
    tracking,
    report: ReportResult,
    merged_manifest,
    merged,
    base_run,
    parent,
    chain_plot: Path | None = None,
) -> None:
    """The same held-out figures (heldout/nll, heldout/perplexity, ...) on every model's own run, at the step of
    its place in the chain (base 0, each stage, merged last), and as one series on the pipeline run: one MLflow
    chart then overlays base -> each stage -> merged, and two pipeline runs overlay. That chart can only number
    its steps, so the pipeline run also gets the plot with each model named (`chain_plot`, the chart view's first
    card) and the step order as its `chain` tag. The merged model's figures are also attached to its registered
    version (its logged model)."""
    stages = [read_manifest(Path(a).parent, AdapterManifest) for a in merged_manifest.adapters]
    runs = {"base": base_run, **{m.stage: m.mlflow_run_id for m in stages}, "merged": merged_manifest.mlflow_run_id}
    figures = {entry["model"]: entry["metrics"] for entry in report.held_out_figures()}
    if stages and stages[-1].stage not in figures:  # the last stage's model is the merged model
        figures[stages[-1].stage] = figures["merged"]
    client, model_id = tracking.client(), None
    if merged_manifest.mlflow_run_id:  # the merge's run logged the model: the figures go on that logged model
        outputs = client.get_run(merged_manifest.mlflow_run_id).outputs
        model_id = next((o.model_id for o in (outputs.model_outputs if outputs else [])), None)
    version = version_for(client, pipeline.name, merged)
    if version is not None and "merged" in figures:  # and on the registered version's page, as its tags
        for name, value in figures["merged"].items():
            client.set_model_version_tag(pipeline.name, version, name, f"{value:.6g}")
    chain = ["base", *(m.stage for m in stages), "merged"]
    client.set_tag(parent, "chain", " -> ".join(f"{step} {name}" for step, name in enumerate(chain)))
    if chain_plot is not None:
        tracking.log_image(parent, chain_plot, CHAIN_IMAGE)
    for step, name in enumerate(chain):
        if name not in figures:
            continue
        tracking.log_metrics(parent, on_pipeline_run(chain, figures, name), step=step)
        if runs.get(name):
            tracking.log_metrics(runs[name], figures[name], step=step, model_id=model_id if name == "merged" else None)
    context.log.info("held-out figures logged on " + ", ".join(f"{n} ({r or 'no run'})" for n, r in runs.items()))


def on_pipeline_run(chain: list[str], figures: dict[str, dict[str, float]], name: str) -> dict[str, float]:
    """Of the figures of the chain's model `name`, those the pipeline run logs at its step: a figure every model of
    the chain has (a line over the stages), else only the merged model's (one point at the last step). MLflow
    draws a series as a line through its points, so a figure measured on base and merged alone would otherwise
    read as a straight line across the stages between, which nothing measured."""
    return {
        key: value
        for key, value in figures[name].items()
        if name == "merged" or all(key in figures.get(model, {}) for model in chain)
    }


def evaluation_metadata(evaluation: dict | None) -> dict:
    """The MLflow evaluation on the asset: the link to both models' rows, the dataset and the runs, or why not."""
    if not evaluation:
        return {}
    if "error" in evaluation:
        return {"mlflow_evaluation_error": MetadataValue.text(evaluation["error"])}
    return {
        "mlflow_evaluation": MetadataValue.url(evaluation["url"]),
        "mlflow_evaluation_dataset": f"{evaluation['dataset_name']} ({evaluation['dataset_id']})",
        "mlflow_evaluation_runs": MetadataValue.json(evaluation["runs"]),
    }


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
    started = time.time()  # the base and report runs span the evaluation, not only their logging
    with (
        stage_runs(context, pipeline, tracking, stage.name) as runs,  # before the work, so its duration includes it
        store.new_artifact(pipeline.name, stage.name, context.op_execution_context.run_id) as (tmp, final),
    ):
        merged_manifest = read_manifest(merged, MergedManifest)
        first_stage = merged_manifest.adapters[:1] if len(merged_manifest.adapters) > 1 else []
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
                taste=taste.localize(tmp) if taste else None,
                reward_models=feedback.get("reward_models", []),
                liked_at=feedback["liked_at"],
                objectives=feedback["objectives"],
            )
        # the live version of the system prompt, as chat sends it (a copy of the rows when it is not the YAML's)
        yaml_system = pipeline.system_prompt()
        system, prompt_uri = live_system(pipeline, tracking, yaml_system)
        eval_file, resystemed = rows_with_system(Path(dataset) / "eval.jsonl", yaml_system, system, tmp / "eval.jsonl")
        if resystemed:
            context.log.info(f"{resystemed} held-out row(s) evaluated with the live system prompt {prompt_uri}")
        job = catalog.kind_of(stage).job_model()(
            settings=stage,
            inputs=ReportInputs(
                base_model=merged_manifest.resolved_model,
                merged_model=merged_manifest.info.model_dir,
                eval_file=str(eval_file),
                train_file=str(Path(dataset) / "train.jsonl"),
                chain=chain_of(merged_manifest),
                first_stage_adapters=first_stage,
                feedback=feedback_inputs,
                tools=pipeline.tools.to_input(tmp / "tools") if pipeline.tools else None,
            ),
            output_dir=str(tmp),
        )
        report: ReportResult = training.run_job(context, job, tmp, env=tracking.env(), store=store, final=final)
        tags = {
            "pipeline": pipeline.name,
            "asset_key": context.asset_key.to_user_string(),
            "dagster_run_id": context.op_execution_context.run_id,
            "base_model": pipeline.model,
            **({PROMPT_TAG: prompt_uri} if prompt_uri else {}),
            **sweep_tags_of(context.run.tags),  # a sweep's point: which sweep, which point, its settings
        }
        with runs.open(
            "base",
            {**tags, "stage": "base", **colour_tag("base", tags["dagster_run_id"])},
            {"model": pipeline.model, "rows": report.rows},
            f"The base model `{pipeline.model}` on the held-out rows {stage.name} scores every model on.",
            start_time=started,
        ) as base_run:
            tracking.log_metrics(base_run, report.base_metrics())
            (tmp / "base.json").write_text(json_figures(report.base))
            tracking.log_artifacts(base_run, [tmp / "base.json"])
        with runs.open(
            stage.name,
            {
                **tags,
                "stage": stage.name,
                "upstream_mlflow_run_id": merged_manifest.upstream_mlflow_run_id,
                "base_mlflow_run_id": base_run,
                **colour_tag("merged", tags["dagster_run_id"]),
            },
            {"model": pipeline.model, "merged": merged, **settings},
            f"Base against merged on {report.rows} rows of `{Path(dataset).parent.name}`: the "
            "report, the judge, and the held-out loss after each stage.",
            start_time=started,
            prompt=prompt_uri,
        ) as report_run:
            tracking.log_metrics(report_run, report.run_metrics())
            # before report.md is logged: it links the evaluation (or says why there is none)
            source = stage_source(context)
            evaluation = log_evaluation(
                tracking, pipeline.name, stage.name, tmp, final.name, report.metrics, tags, report_run, source
            )
            if "error" in evaluation:  # the report's own outputs stand: the failure is recorded in it, not raised
                context.log.warning(f"no MLflow evaluation of the report's rows: {evaluation['error']}")
            record_evaluation(tmp, evaluation)
            report = report.model_copy(update={"mlflow_evaluation": evaluation})
            chain_plot = plot_chain(report.held_out_figures(), tmp / "heldout.png")  # None: no NLL (prompt data)
            tracking.log_artifacts(
                report_run, [tmp / "report.md", tmp / "report.json", tmp / "loss.png", tmp / "heldout.png"]
            )
        log_held_out(context, pipeline, tracking, report, merged_manifest, merged, base_run, runs.parent, chain_plot)
        tracking.log_metrics(runs.parent, report.run_metrics())  # the pipeline run's own figures: the merged model's
        write_manifest(
            tmp,
            ReportManifest(
                merged=merged,
                dataset=dataset,
                settings=stage,
                mlflow_run_id=report_run,
                base_mlflow_run_id=base_run,
                dagster_run_id=context.op_execution_context.run_id,
                held_out_rows=report.held_out_rows,
            ),
        )
    metadata = {
        "artifact_dir": MetadataValue.path(str(final)),
        "report": MetadataValue.md((final / "report.md").read_text()),
        "mlflow_run": MetadataValue.url(tracking.run_url(pipeline.name, report_run)),
        "mlflow_runs": MetadataValue.url(tracking.runs_url(pipeline.name)),
        **evaluation_metadata(report.mlflow_evaluation),
        "profile": context.run.tags.get(PROFILE_TAG) or "none",
        **({"system_prompt_version": MetadataValue.text(prompt_uri)} if prompt_uri else {}),
        **image_markdown("heldout_chain", final / "heldout.png", "held-out NLL along the chain"),
        **image_markdown("stage_curves", final / "loss.png", "each stage's training curve"),
        **as_metadata(report.metadata()),
    }
    return Output(str(final), metadata=metadata)
