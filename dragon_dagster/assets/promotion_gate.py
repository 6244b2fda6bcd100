"""The promotion gate of a retraining (a blocking check on the retrained report): the retrained model must beat
the model it started from on the held-out feedback (feedback.gate), be no worse on the pipeline's task and its
general skills, and that model must still be the champion; passing makes the retrained model the champion, or,
with gate.live, the challenger the live gate sensor decides on."""

from pathlib import Path

from dagster import AssetCheckResult, AssetCheckSeverity, AssetKey, MetadataValue, asset_check

from ..engine.artifacts.manifest import MergedManifest, read_manifest
from ..engine.pipeline import Pipeline
from ..engine.pipeline.retraining import TASK_TOLERANCE, Gate, skill_falls
from ..engine.stages.evaluate.checks import read_report
from ..resources import ArtifactStore, MLflowTracking
from .live_gate import await_live
from .promotion import deployed_model, promote_merged, report_merged_dir


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
