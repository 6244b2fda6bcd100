"""The general-skills guard at the promotion gate (issue 30): a retrained model made to forget how to copy text
(a deliberate SFT that answers every copy prompt with one word) is measured by the real evaluate worker against
the embedded SmolLM2 it started from, and the gate, on a real Dagster instance and MLflow store, refuses it and
names the task; a report within the tolerance is promoted."""

import json
import random
import uuid
from pathlib import Path

import pytest
from dagster import AssetKey, AssetMaterialization, DagsterInstance, MetadataValue, build_asset_check_context

from dragon_dagster.assets.promotion_gate import promotion_check
from dragon_dagster.engine.pipeline import load
from tests.support import write_pipeline

FEEDBACK = {"held_out": {"rated_replies": 4, "liked": 2, "disliked": 2, "pairs": 0, "prompts": 4}}


class Gate:
    """promotion_check of a tiny pipeline, run on reports written here (no retraining job)."""

    def __init__(self, tiny_model, tmp_path):
        from dragon_dagster.resources import ArtifactStore, MLflowTracking

        self.tmp = tmp_path
        runs = tmp_path / "runs"
        self.tracking, self.store = MLflowTracking(runs_dir=str(runs)), ArtifactStore(runs_dir=str(runs))
        self.model = Path(tiny_model)
        self.instance = DagsterInstance.ephemeral()
        self.key = AssetKey(["tiny", "retrained_report"])
        self.check = promotion_check(load(write_pipeline(tmp_path / "defs", tiny_model)), self.key)

    def on(self, report: dict):
        """The gate's result on a report.json (with a reward gain on the held-out feedback added)."""
        from dragon_dagster.engine.artifacts.manifest import MergedManifest, MergeResult, ReportManifest, write_manifest

        merged = self.tmp / f"merged-{uuid.uuid4().hex[:6]}"
        merged.mkdir()
        self.tracking.register_model("tiny", self.model, None, {"artifact_dir": str(merged)})
        info = MergeResult(model_dir=str(self.model), size_mb=1.0, parameters=1, sample_prompt="q", sample_reply="a")
        write_manifest(
            merged, MergedManifest(base_model=str(self.model), resolved_model="", adapters=[], info=info, settings={})
        )
        report_dir = self.tmp / f"report-{uuid.uuid4().hex[:6]}"
        report_dir.mkdir()
        report = {**report, "feedback": {**FEEDBACK, "reward": {"start": 0.0, "retrained": 0.05, "gain": 0.05}}}
        (report_dir / "report.json").write_text(json.dumps(report))
        write_manifest(report_dir, ReportManifest(merged=str(merged), dataset="sft_dataset", settings={}))
        self.instance.report_runless_asset_event(
            AssetMaterialization(self.key, metadata={"artifact_dir": MetadataValue.path(str(report_dir))})
        )
        resources = {"tracking": self.tracking, "store": self.store}
        return self.check(build_asset_check_context(instance=self.instance, resources=resources))


def chat_report(skills: dict | None) -> dict:
    same = {"eval_loss": 1.0, "metrics": {"token_f1": 0.5}}
    return {"task": "chat", "held_out": True, "rows": 2, "merged_not_worse": True, "base": same, "merged": same,
            "skills": skills}  # fmt: skip


def skills_of(base: dict[str, float], merged: dict[str, float]) -> dict:
    from dragon_dagster.engine.evaluate.general_skills import skill_changes

    figures = lambda scores: {n: {"metric": "acc", "score": s, "items": 16} for n, s in scores.items()}  # noqa: E731
    return {"changes": skill_changes(figures(base), figures(merged))}


def test_the_gate_refuses_a_fall_beyond_the_tolerance_naming_the_task_and_promotes_within_it(tiny_model, tmp_path):
    gate = Gate(tiny_model, tmp_path)
    start = {"skills_copy": 0.5, "skills_order": 0.5}
    within = gate.on(chat_report(skills_of(start, {"skills_copy": 0.5, "skills_order": 0.4375})))  # -0.0625
    assert within.passed, within.metadata["decision"].value
    assert within.metadata["decision"].value == (
        "promoted: reward gain above 0.0 and no task regression nor general-skill loss"
    )
    assert within.metadata["skills_fell"].value == "none"
    fell = gate.on(chat_report(skills_of(start, {"skills_copy": 0.5, "skills_order": 0.375})))
    assert not fell.passed
    assert fell.metadata["decision"].value == (
        "general skill skills_order fell 0.50 -> 0.38 (acc), beyond skills_tolerance 0.1"
    )
    assert fell.metadata["skills_fell"].value == "skills_order"
    assert fell.metadata["start/skills/skills_order"].value == 0.5
    assert fell.metadata["retrained/skills/skills_order"].value == 0.375
    no_suite = gate.on(chat_report(None))  # a report that ran no skills: the gate as it was
    assert no_suite.passed and "skills_fell" not in no_suite.metadata


def forgotten_copy(base: Path, out: Path) -> Path:
    """The base model after a deliberate SFT that answers every copy prompt with "banana": it forgets copying."""
    import torch
    from transformers import AutoModelForCausalLM

    from dragon_dagster.engine.models import load_tokenizer

    torch.manual_seed(0)
    rng = random.Random(0)
    tokenizer, model = load_tokenizer(str(base)), AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4)  # high on purpose: forgetting in a few steps
    model.train()
    for _ in range(3):
        texts = [
            "Copy the text exactly.\nText: " + "".join(rng.choice("abcdefghijk0123456789") for _ in range(7))
            + "\nCopy: banana"
            for _ in range(4)
        ]  # fmt: skip
        batch = tokenizer(texts, return_tensors="pt", padding=True)
        labels = batch.input_ids.masked_fill(batch.attention_mask == 0, -100)
        model(**batch, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.mark.slow  # an SFT of the 135M model, the suite on two models: 1.8 min on 2 idle cores, 5 loaded
def test_a_retraining_made_to_forget_copying_is_refused_and_the_gate_names_the_task(embedded_dir, tiny_model, tmp_path):
    from dragon_dagster.engine import catalog
    from dragon_dagster.engine.config.reporter import Reporter
    from dragon_dagster.engine.data.tables import write_jsonl
    from dragon_dagster.engine.pipeline.retraining import FeedbackEvaluate
    from dragon_dagster.engine.stages.evaluate.inputs import ReportInputs
    from dragon_dagster.engine.stages.evaluate.worker import evaluate_report

    forgot = forgotten_copy(embedded_dir, tmp_path / "forgot")
    rows = [
        {"prompt": [{"role": "user", "content": "Hub Pro blinks red"}], "completion": [
            {"role": "assistant", "content": "Check the Ethernet cable."}]},
        {"prompt": [{"role": "user", "content": "The chime is silent"}], "completion": [
            {"role": "assistant", "content": "Re-pair it in Settings."}]},
    ]  # fmt: skip
    write_jsonl(tmp_path / "eval.jsonl", rows)
    stage = FeedbackEvaluate(
        skills=["skills_copy", "skills_arithmetic"], skills_limit=8, n_samples=1, max_new_tokens=4, max_eval_rows=2
    )
    out = tmp_path / "report"
    out.mkdir()
    inputs = ReportInputs(
        base_model=str(embedded_dir), merged_model=str(forgot), eval_file=str(tmp_path / "eval.jsonl")
    )
    job = catalog.kind_of(stage).job_model()(settings=stage, inputs=inputs, output_dir=str(out))
    result = evaluate_report(job, Reporter())
    copy = {c["task"]: c for c in result.skills["changes"]}["skills_copy"]
    assert copy["base"] >= 0.75 and copy["merged"] <= 0.25, copy  # it copied, and it no longer does
    assert "| skills_copy | acc | 8 |" in (out / "report.md").read_text()
    assert result.run_metrics()["skills/skills_copy"] == copy["merged"]
    assert result.base_metrics()["skills/skills_copy"] == copy["base"]

    verdict = Gate(tiny_model, tmp_path).on(json.loads((out / "report.json").read_text()))
    assert not verdict.passed
    assert f"general skill skills_copy fell {copy['base']:.2f} -> {copy['merged']:.2f} (acc)" in (
        verdict.metadata["decision"].value
    )
    assert "skills_copy" in verdict.metadata["skills_fell"].value.split(", ")
