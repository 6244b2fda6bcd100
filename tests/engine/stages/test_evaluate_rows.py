"""The evaluate stage scores a bounded, seeded sample of its held-out split (issue 63): max_eval_rows rows drawn
with its seed (the same rows each run, not the split's first ones), the count stated in its log, report.json,
report.md and the per-row replies; a retraining's held-out feedback is bounded the same way."""

import json

from dragon_dagster.engine import catalog
from dragon_dagster.engine.data.tables import write_jsonl
from dragon_dagster.engine.stages.evaluate.inputs import FeedbackInputs, ReportInputs
from dragon_dagster.engine.stages.evaluate.settings import Evaluate
from dragon_dagster.engine.stages.evaluate.worker import evaluate_report, report_rows
from tests.support import Recorded


def chat_rows(n: int, start: int = 0) -> list[dict]:
    return [
        {
            "prompt": [{"role": "user", "content": f"Ticket {i}: the hub blinks"}],
            "completion": [{"role": "assistant", "content": f"Restart hub {i}."}],
        }
        for i in range(start, start + n)
    ]


def job_of(tmp_path, model: str = "unused", feedback: FeedbackInputs | None = None, eval_rows: int = 30, **settings):
    if eval_rows:
        write_jsonl(tmp_path / "eval.jsonl", chat_rows(eval_rows))
    write_jsonl(tmp_path / "train.jsonl", chat_rows(40, start=100))
    stage = Evaluate(name="evaluation_report", kind="evaluate", dataset="rows", **settings)
    inputs = ReportInputs(
        base_model=model,
        merged_model=model,
        eval_file=str(tmp_path / "eval.jsonl"),
        train_file=str(tmp_path / "train.jsonl"),
        feedback=feedback,
    )
    out = tmp_path / "report"
    out.mkdir(exist_ok=True)
    return catalog.kind_of(stage).job_model()(settings=stage, inputs=inputs, output_dir=str(out))


def tickets(rows: list[dict]) -> list[str]:
    return [r["prompt"][0]["content"] for r in rows]


def test_the_report_scores_a_seeded_sample_of_max_eval_rows_not_the_first_rows(tmp_path):
    rows, held_out, counted = report_rows(job_of(tmp_path, max_eval_rows=5))
    again, _, _ = report_rows(job_of(tmp_path, max_eval_rows=5))
    other, _, _ = report_rows(job_of(tmp_path, max_eval_rows=5, seed=7))
    assert held_out and len(rows) == 5 and tickets(rows) == tickets(again), "the same rows for the same seed"
    assert tickets(rows) != tickets(other), "another seed draws other rows"
    assert tickets(rows) != tickets(chat_rows(5)), "a sample of the split, not its first rows"
    numbers = [int(t.split()[1].rstrip(":")) for t in tickets(rows)]
    assert numbers == sorted(numbers), "in the split's order"
    assert counted.model_dump() == {"scored": 5, "total": 30, "setting": "max_eval_rows"}
    assert counted.sentence() == "5 of 30 (a seeded sample: max_eval_rows)"

    every, _, counted = report_rows(job_of(tmp_path, max_eval_rows=None))
    assert len(every) == 30 and counted.sentence() == "30 of 30"
    assert Evaluate(name="e", kind="evaluate", dataset="d").max_eval_rows == 50
    # the retrained report's sample also bounds the held-out feedback the promotion gate decides on: a larger one
    from dragon_dagster.engine.pipeline.retraining import FeedbackEvaluate

    assert FeedbackEvaluate().max_eval_rows == 200


def test_without_a_held_out_split_the_sample_is_of_the_training_rows(tmp_path):
    rows, held_out, counted = report_rows(job_of(tmp_path, eval_rows=0, max_eval_rows=6))
    assert not held_out and counted.total == 40 and len(rows) == 6
    assert tickets(rows) != tickets(chat_rows(6, start=100))


def test_the_report_its_replies_and_the_held_out_feedback_are_on_the_sample(tiny_model, tmp_path):
    """Cheap: the tiny model as base and merged, 4 rows, 2 new tokens; no judge, no skills."""
    feedback_dir = tmp_path / "feedback"
    feedback_dir.mkdir()
    rated = [{**r, "label": i % 2 == 0} for i, r in enumerate(chat_rows(9, start=500))]
    write_jsonl(feedback_dir / "kto.jsonl", rated)
    feedback = FeedbackInputs(held_out={"kto": str(feedback_dir / "kto.jsonl")})
    job = job_of(
        tmp_path, str(tiny_model), feedback, eval_rows=12, max_eval_rows=4, n_samples=1, max_new_tokens=2, n_judge=0
    )
    reporter = Recorded()
    result = evaluate_report(job, reporter)
    chosen, _, _ = report_rows(job)
    out = tmp_path / "report"

    assert result.rows == 4 and result.held_out_rows.model_dump() == {
        "scored": 4,
        "total": 12,
        "setting": "max_eval_rows",
    }
    assert json.loads((out / "report.json").read_text())["held_out_rows"]["total"] == 12
    assert "4 of 12 (a seeded sample: max_eval_rows) held-out rows" in (out / "report.md").read_text()
    assert "evaluating the base model on 4 of 12 (a seeded sample: max_eval_rows) held-out rows" in reporter.lines
    assert result.metadata()["held_out_rows"] == "4 of 12 (a seeded sample: max_eval_rows)"
    replies = [json.loads(line) for line in (out / "replies.jsonl").read_text().splitlines()]
    assert [r["prompt"] for r in replies] == tickets(chosen), "the per-row replies are the sample's rows"
    assert result.base["eval_tokens"] > 0 and len(result.stage_changes) == 0

    held = result.feedback["held_out"]
    assert held["rated_replies"] == 4 and held["sampled_from"] == {"rated_replies": 9, "pairs": 0}
    assert any("4 of 9 rated replies" in line for line in reporter.lines)
