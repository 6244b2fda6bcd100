"""RLHF from chat feedback through the sensor, on a real Dagster instance: the feedback pairs train a reward model,
GRPO samples fresh replies to the rated prompts and is scored by it (a lineage edge in the asset graph), the
report's liked share is the reward model's taste, and the promotion gate decides."""

import json
from pathlib import Path

import pytest
from dagster import AssetKey, AssetSelection, DagsterInstance, Definitions, materialize

from dragon_dagster.assets.factory import build_pipeline_defs
from dragon_dagster.engine.data.feedback.sqlite import SQLiteFeedbackStore
from dragon_dagster.engine.pipeline import load
from tests.assets.test_retraining import NAMES, tick
from tests.support import write_pipeline

RLHF = """\
    objectives: [dpo, rlhf]
    reward_model: {args: {max_steps: 4, batch_size: 2, logging_steps: 1, save_steps: 50, learning_rate: 5.0e-3}}
    rlhf: {args: {max_steps: 2, batch_size: 2, logging_steps: 1, save_steps: 50}, group_size: 2,
           max_new_tokens: 8, max_eval_prompts: 2, n_samples: 1}
"""
TASTE = (
    "gate: {taste: [{type: reward_model, stage: feedback_reward_model, normalize: sigmoid, name: learned}], "
    "liked_at: 0.5, min_gain: null}"
)


def rlhf_pipeline(directory: Path, model: Path):
    path = write_pipeline(directory, model)
    text = path.read_text()
    text = text.replace("    min_new_records: 3\n", "    min_new_records: 3\n" + RLHF)
    start = text.index("    gate:")
    text = text[:start] + "    " + TASTE + "\n"
    path.write_text(text)
    return load(path)


@pytest.mark.slow  # the tiny chain, then a reward model, DPO, GRPO, merge and report: ~2-3 min on 2 cores
def test_rlhf_retraining_from_feedback_through_the_sensor(materialized, tmp_path):
    from dragon_dagster.resources import ArtifactStore, MLflowTracking, TrainingResource

    pipeline = rlhf_pipeline(tmp_path / "defs", Path(materialized["pipeline"].model))
    parts = build_pipeline_defs(pipeline)
    runs = tmp_path / "runs"
    resources = {
        "store": ArtifactStore(runs_dir=str(runs)),
        "tracking": MLflowTracking(runs_dir=str(runs)),
        "training": TrainingResource(device="cpu"),
    }
    graph = Definitions(assets=parts["assets"], resources=resources).resolve_asset_graph()
    parents = graph.get(AssetKey(["tiny", "rlhf_on_feedback"])).parent_keys
    assert {AssetKey(["tiny", "feedback_reward_model"]), AssetKey(["tiny", "kto_on_feedback"])} <= parents
    assert AssetKey(["tiny", "feedback_reward_model"]) in graph.get(AssetKey(["tiny", "retrained_report"])).parent_keys

    instance = DagsterInstance.ephemeral()
    tracking, store_resource = resources["tracking"], resources["store"]
    deployed = Path(materialized["outcome"]["artifacts"]["merged_model"]) / "model"
    tracking.promote("tiny", tracking.register_model("tiny", deployed, None, {"note": "by hand"}), "by hand")
    assert materialize(
        parts["assets"],
        instance=instance,
        resources=resources,
        selection=AssetSelection.assets(["tiny", "tickets"], ["tiny", "sft_dataset"]),
    ).success
    store = SQLiteFeedbackStore(store_resource.feedback_path("tiny"))
    for i, subject in enumerate(["Hub Pro blinks red", "Doorbell lags", "Plug offline", "Lock jams", "Chime silent"]):
        turns = [{"role": "user", "content": subject}]
        store.record(f"c{i}", turns, f"Sorry, {subject.lower()} happens. Restart it.", "up", model=str(deployed))
        store.record(f"c{i}", turns, "no", "down", model=str(deployed))
    [sensor_def] = parts["sensors"]
    [request], _ = tick(sensor_def, instance, store_resource)  # 10 records >= min_new_records
    names = [n for n in NAMES]
    result = materialize(
        parts["assets"] + parts["asset_checks"],
        instance=instance,
        resources=resources,
        selection=AssetSelection.assets(*[["tiny", n] for n in names]),
        tags=request.tags,
        raise_on_error=False,
    )
    steps = {s.step_key: s.status.value for s in instance.get_run_step_stats(result.run_id)}
    assert all(steps[f"tiny__{n}"] == "SUCCESS" for n in names), steps
    events = {
        e.asset_key.path[-1]: e.metadata
        for e in (ev.event_specific_data.materialization for ev in result.get_asset_materialization_events())
    }
    tags = instance.get_run_by_id(result.run_id).tags
    assert tags["dragon/feedback_rlhf"] == "4 rows from 8 records"  # 4 of 5 conversations trained on, 1 held out
    assert tags["dragon/feedback_feedback_reward_model"] == "4 rows from 8 records"  # its 4 pairs
    assert tags["dragon/feedback_kto"] == "skipped: off (feedback.objectives)"

    rm = json.loads((Path(events["feedback_reward_model"]["artifact_dir"].value) / "manifest.json").read_text())
    assert rm["method"] == "reward_model" and rm["result"]["eval_pairs"] == 1
    rlhf_dir = Path(events["rlhf_on_feedback"]["artifact_dir"].value)
    rlhf = json.loads((rlhf_dir / "manifest.json").read_text())
    dpo = json.loads((Path(events["dpo_on_feedback"]["artifact_dir"].value) / "manifest.json").read_text())
    assert rlhf["method"] == "grpo" and rlhf["chain"] == dpo["chain"] + [str(rlhf_dir / "adapter")]
    job = json.loads((rlhf_dir / "job.json").read_text())
    assert [m["stage"] for m in job["inputs"]["reward_models"]] == ["feedback_reward_model"]
    assert set(rlhf["result"]["guard_after"]) == {"not_rambling"}  # watched, never trained on
    run = tracking.client().get_run(rlhf["mlflow_run_id"])
    assert run.data.tags["reward_model.feedback_reward_model.mlflow_run_id"] == rm["mlflow_run_id"]

    report = json.loads((Path(events["retrained_report"]["artifact_dir"].value) / "report.json").read_text())
    by_objective = {o["objective"]: o for o in report["objectives"]}
    assert by_objective["rlhf"]["ran"] and by_objective["rlhf"]["unit"] == "prompts"
    liked = report["feedback"]["liked_share"]  # the reward model's taste scored the fresh replies
    assert 0 <= liked["start"] <= 1 and 0 <= liked["retrained"] <= 1
    [gate] = [e for e in result.get_asset_check_evaluations() if e.check_name == "promotion_gate"]
    decision = gate.metadata["decision"].value
    assert decision.startswith("promoted") == gate.passed and gate.passed == result.success
