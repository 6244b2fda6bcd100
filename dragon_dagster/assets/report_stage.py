"""The evaluation report asset's work: run the report job, log base and merged figures to MLflow."""

from __future__ import annotations

import shutil
from pathlib import Path

from dagster import MetadataValue, Output

from ..engine.artifacts import read_manifest, write_manifest
from ..engine.evaluate.replies import eval_metrics
from ..engine.spec.pipeline import Pipeline
from ..engine.spec.stages import Evaluate
from .metadata import finite, md_table


def judge_metrics(judged: dict) -> dict:
    return finite(
        {
            f"judge/{name}_win_rate": figures.get("win_rate")
            for name, figures in judged.items()
            if isinstance(figures, dict)
        }
    )


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
    merged_manifest = read_manifest(merged)
    adapters = [read_manifest(Path(a).parent) for a in merged_manifest["adapters"]]
    stages = [
        {"name": m.get("stage", Path(a).parent.parent.name), "dir": str(Path(a).parent)}
        for m, a in zip(adapters, merged_manifest["adapters"])
    ]
    stage_results = [
        {"name": m.get("stage"), "method": m.get("method"), "result": m.get("result", {})} for m in adapters
    ]
    first_stage = merged_manifest["adapters"][:1] if len(merged_manifest["adapters"]) > 1 else []
    rewards = [
        {"name": s["name"], "dir": s["dir"], "rewards": m["settings"]["rewards"]}  # custom files: under dir
        for m, s in zip(adapters, stages)
        if m.get("method") == "grpo" and (m.get("settings") or {}).get("rewards")
    ]
    with store.new_artifact(pipeline.name, stage.name, context.run_id) as (tmp, final):
        job = {
            "settings": settings,
            "base_model": merged_manifest["resolved_model"],
            "merged_model": merged_manifest["info"]["model_dir"],
            "eval_file": str(Path(dataset) / "eval.jsonl"),
            "train_file": str(Path(dataset) / "train.jsonl"),
            "stages": stages,
            "output_dir": str(tmp),
            "stage_results": stage_results,
            "first_stage_adapters": first_stage,
            "rewards": rewards,
        }
        if feedback:  # the held-out feedback and taste files travel with the report (and to a remote worker)
            (tmp / "feedback").mkdir()
            held_out = {}
            for objective, path in feedback["held_out"].items():
                shutil.copyfile(path, tmp / "feedback" / f"{objective}.jsonl")
                held_out[objective] = f"feedback/{objective}.jsonl"
            taste = feedback.get("taste")
            job["feedback"] = {
                **feedback,
                "held_out": held_out,
                "taste": taste.localize(tmp).to_list(relative_to=tmp) if taste else None,
            }
        report = training.run_job(context, job, tmp, env=tracking.env(), store=store, final=final)
        tags = {
            "pipeline": pipeline.name,
            "asset_key": context.asset_key.to_user_string(),
            "dagster_run_id": context.run_id,
            "base_model": pipeline.model,
        }
        base_run = tracking.start_run(
            pipeline.name, "base", {**tags, "stage": "base"}, {"model": pipeline.model, "rows": report["rows"]}
        )
        tracking.log_metrics(base_run, eval_metrics(report["base"]))
        tracking.end_run(base_run)
        report_run = tracking.start_run(
            pipeline.name,
            stage.name,
            {
                **tags,
                "stage": stage.name,
                "upstream_mlflow_run_id": merged_manifest.get("upstream_mlflow_run_id"),
                "base_mlflow_run_id": base_run,
            },
            {"model": pipeline.model, "merged": merged, **settings},
        )
        tracking.log_metrics(
            report_run,
            {
                **eval_metrics(report["merged"]),
                **judge_metrics(report.get("judge", {})),
                **feedback_metrics(report.get("feedback")),
                **{f"stage_nll/{s['stage']}": s["eval_loss"] for s in report.get("stage_nll", []) if s.get("stage")},
            },
        )
        tracking.log_artifacts(report_run, [tmp / "report.md", tmp / "report.json", tmp / "loss.png"])
        tracking.end_run(report_run)
        write_manifest(
            tmp,
            kind="evaluation_report",
            merged=merged,
            dataset=dataset,
            settings=settings,
            mlflow_run_id=report_run,
            base_mlflow_run_id=base_run,
            dagster_run_id=context.run_id,
        )
    metadata = {
        "artifact_dir": MetadataValue.path(str(final)),
        "report": MetadataValue.md((final / "report.md").read_text()),
        "mlflow_run": MetadataValue.url(tracking.run_url(pipeline.name, report_run)),
        "merged_not_worse": report["merged_not_worse"],
    }
    if report.get("task") == "prompts":  # no loss on prompts: each reward, base against merged
        metadata.update(
            {
                "computed_on": MetadataValue.json(report["computed_on"]),
                "rewards": MetadataValue.md(reward_table(report)),
                **{f"base/{k}": v for k, v in eval_metrics(report["base"]).items()},
            }
        )
    else:
        metadata.update(
            {"base_eval_loss": report["base"]["eval_loss"], "merged_eval_loss": report["merged"]["eval_loss"]}
        )
    metadata.update({f"merged/{k}": v for k, v in eval_metrics(report["merged"]).items()})
    metadata.update(feedback_metrics(report.get("feedback")))
    if report.get("objectives"):
        metadata["objectives"] = md_table(
            [
                {k: o.get(k) for k in ("objective", "ran", "rows", "unit", "records", "skipped")}
                for o in report["objectives"]
            ]
        )
    return Output(str(final), metadata=metadata)


def feedback_metrics(figures: dict | None) -> dict:
    """A retraining's held-out feedback figures as flat numbers: feedback/<metric>_start, _retrained, _gain."""
    out = {}
    for name in ("reward", "pair_accuracy", "liked_share"):
        for when, value in ((figures or {}).get(name) or {}).items():
            if when in ("start", "retrained", "gain"):
                out[f"feedback/{name}_{when}"] = value
    return finite(out)


def reward_table(report: dict) -> str:
    """Each reward's mean (and share scoring 1 where accuracy-like), base against merged, as markdown."""
    base, merged = report["base"], report["merged"]
    lines = [
        f"On {report['computed_on']['rows']} {report['computed_on']['split']} prompts.",
        "",
        "| reward | type | weight | base | merged | base share scoring 1 | merged share scoring 1 |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in report.get("rewards", []):
        name, accuracy = r["name"], r["name"] in base.get("accuracy", {})
        lines.append(
            f"| {name} | {r['type']} | {r['weight']:g} | {base['rewards'][name]:.4f} | "
            f"{merged['rewards'][name]:.4f} | "
            + (f"{base['accuracy'][name]:.4f} | {merged['accuracy'][name]:.4f} |" if accuracy else " |  |")
        )
    if "reward" in base:
        lines.append(f"| weighted total | | | {base['reward']:.4f} | {merged['reward']:.4f} | | |")
    else:
        lines.append("No GRPO stage in the merged model's chain: no rewards.")
    return "\n".join(lines)
