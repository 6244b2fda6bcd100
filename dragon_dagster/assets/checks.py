"""Asset checks: the dataset is usable, the adapter learned, the merged model is not worse than the base."""


import json
import math
from pathlib import Path

from dagster import AssetCheckResult, AssetCheckSeverity, AssetKey, asset_check

from ..engine import data as data_lib
from ..engine import progress
from ..engine.pipeline_spec import Pipeline

MAX_DUPLICATE_SHARE = 0.2


def latest_path(context, key: AssetKey) -> Path:
    event = context.instance.get_latest_materialization_event(key)
    return Path(event.asset_materialization.metadata["artifact_dir"].value)


def dataset_check(key: AssetKey):
    @asset_check(asset=key, name="dataset_quality",
                 description=f"Non-empty, no empty prompt or response, duplicates under {MAX_DUPLICATE_SHARE:.0%}.")
    def _check(context) -> AssetCheckResult:
        path = latest_path(context, key)
        rows = data_lib.read_jsonl(path / "train.jsonl") + data_lib.read_jsonl(path / "eval.jsonl")
        quality = data_lib.quality(rows)
        ok = (quality["rows"] > 0 and quality["empty_prompts"] == 0 and quality["empty_replies"] == 0
              and quality["duplicate_share"] <= MAX_DUPLICATE_SHARE)
        return AssetCheckResult(passed=ok, metadata=quality)
    return _check


def adapter_check(key: AssetKey):
    @asset_check(asset=key, name="losses_finite_and_falling",
                 description="Every logged training loss is finite and the last is below the first.")
    def _check(context) -> AssetCheckResult:
        losses = [r["loss"] for r in progress.read(latest_path(context, key)) if r.get("loss") is not None]
        finite = all(math.isfinite(x) for x in losses)
        falling = len(losses) >= 2 and losses[-1] < losses[0]
        return AssetCheckResult(passed=bool(losses) and finite and falling, metadata={
            "logged_steps": len(losses), "all_finite": finite, "first_loss": losses[0] if losses else -1.0,
            "last_loss": losses[-1] if losses else -1.0})
    return _check


def report_check(key: AssetKey):
    @asset_check(asset=key, name="merged_not_worse_than_base",
                 description="The merged model's held-out loss is not above the base model's (a warning).")
    def _check(context) -> AssetCheckResult:
        report = json.loads((latest_path(context, key) / "report.json").read_text())
        return AssetCheckResult(passed=bool(report["merged_not_worse"]), severity=AssetCheckSeverity.WARN,
                                metadata={"base_eval_loss": report["base"]["eval_loss"],
                                          "merged_eval_loss": report["merged"]["eval_loss"]})
    return _check


CHECKS = {"chat_dataset": dataset_check, "sft": adapter_check, "evaluate": report_check}


def build_checks(pipeline: Pipeline) -> list:
    return [CHECKS[s.kind](AssetKey([pipeline.name, s.name])) for s in pipeline.stages if s.kind in CHECKS]
