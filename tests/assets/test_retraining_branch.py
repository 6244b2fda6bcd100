"""'Materialize all' on a pipeline with a feedback section before anyone gave feedback (issue 12, item 11): the
run succeeds, the feedback datasets say why they are skipped, and the retraining, merge, report and promotion
gate after them do not run."""

from dagster import DagsterEventType, DagsterInstance, materialize

from dragon_dagster.assets.factory import build_pipeline_defs
from dragon_dagster.engine.data.feedback.sqlite import SQLiteFeedbackStore
from dragon_dagster.engine.pipeline import load
from tests.support import write_pipeline

FEEDBACK = [
    "feedback_sft_dataset",
    "feedback_pairs",
    "sft_on_feedback",
    "dpo_on_feedback",
    "retrained_model",
    "retrained_report",
]


def test_materialize_all_without_feedback_skips_the_feedback_branch_with_a_reason(tiny_model, tmp_path, resources_for):
    pipeline = load(write_pipeline(tmp_path / "defs", tiny_model))
    resources = resources_for(tmp_path / "runs")
    assert SQLiteFeedbackStore(resources["store"].feedback_path("tiny")).max_id() == 0
    (tmp_path / "home").mkdir()
    instance = DagsterInstance.local_temp(str(tmp_path / "home"))
    parts = build_pipeline_defs(pipeline)
    result = materialize(
        parts["assets"] + parts["asset_checks"], instance=instance, resources=resources, raise_on_error=False
    )  # everything, as the UI's "Materialize all"

    assert result.success
    steps = {s.step_key: s.status.value for s in instance.get_run_step_stats(result.run_id)}
    assert steps["tiny__evaluation_report"] == "SUCCESS", steps  # the main chain ran
    assert steps["tiny__feedback_sft_dataset"] == steps["tiny__feedback_pairs"] == "SUCCESS"  # ran, no output
    assert all(steps.get(f"tiny__{n}") in (None, "SKIPPED") for n in FEEDBACK[2:]), steps
    made = {
        e.asset_key.path[-1]
        for e in (ev.event_specific_data.materialization for ev in result.get_asset_materialization_events())
    }
    assert "evaluation_report" in made and not made & set(FEEDBACK)
    gates = [e for e in result.get_asset_check_evaluations() if e.check_name == "promotion_gate"]
    assert not gates  # the gate did not run
    client = resources["tracking"].client()
    assert client.get_model_version_by_alias("tiny", "challenger").tags["asset_key"] == "tiny/merged_model"
    assert not [
        v for v in client.search_model_versions("name = 'tiny'") if v.tags.get("asset_key") == "tiny/retrained_model"
    ]
    logs = [e.user_message for e in instance.all_logs(result.run_id)]
    for name in FEEDBACK[:2]:
        assert any(m.startswith(f"{name} skipped: no feedback records yet") for m in logs), name
    skipped = instance.all_logs(result.run_id, of_type=DagsterEventType.STEP_SKIPPED)
    assert {e.step_key for e in skipped} >= {"tiny__sft_on_feedback"}
