"""The contamination check in Dagster (issue 63): a report whose evaluation rows a training split holds is not
made, and the check names the rows; a clean pipeline's check passes. Datasets only: nothing trains (the check
blocks the report, and the report's merged model is never asked for)."""

import textwrap

import pandas as pd
from dagster import AssetCheckKey, AssetKey, AssetSelection, DagsterInstance, Definitions, define_asset_job

from dragon_dagster.assets.factory import build_pipeline_defs
from dragon_dagster.engine.pipeline import load
from tests.support import component_yaml

TOPICS = ["thermostat", "doorbell", "camera", "lock", "speaker", "plug", "sensor", "hub"]


def tickets(n: int) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "subject": [f"{TOPICS[i % 8]} case {i}" for i in range(n)],
            "body": [
                f"My {TOPICS[i % 8]} number {i} stopped working after the update {i % 5} yesterday." for i in range(n)
            ],
            "reply": [
                f"Sorry about your {TOPICS[i % 8]}; please restart it and reinstall update {i}." for i in range(n)
            ],
        }
    )


def questions(start: int, n: int) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "question": [f"What is {i} + {i + 1}?" for i in range(start, start + n)],
            "answer": [str(2 * i + 1) for i in range(start, start + n)],
        }
    )


def pipeline_with(folder, tiny_model, trained_questions: pd.DataFrame, report_seed: int):
    """sft trains on `chat` (tickets and the trained questions); grpo on `prompts` (its held-out prompts are an
    evaluation set); the report measures `report_rows`, the tickets split with another seed."""
    folder.mkdir(parents=True)
    chat = pd.concat([tickets(40), trained_questions.rename(columns={"question": "subject", "answer": "reply"})])
    chat.fillna({"body": ""}).to_csv(folder / "chat.csv", index=False)
    questions(100, 20).to_csv(folder / "questions.csv", index=False)
    tickets(40).to_csv(folder / "tickets.csv", index=False)
    (folder / "defs.yaml").write_text(
        component_yaml(
            textwrap.dedent(f"""\
            name: contam
            model: {tiny_model}
            datasets: {{chat: {{path: chat.csv}}, questions: {{path: questions.csv}}, tickets: {{path: tickets.csv}}}}
            stages:
              - {{name: chat_rows, kind: chat_dataset, source: chat, prompt: "{{subject}} {{body}}", response: reply,
                  eval_frac: 0.2, seed: 1}}
              - {{name: prompts, kind: prompt_dataset, source: questions, prompt: question, reference: answer,
                  eval_frac: 0.5}}
              - {{name: report_rows, kind: chat_dataset, source: tickets, prompt: "{{subject}} {{body}}",
                  response: reply, eval_frac: 0.2, seed: {report_seed}}}
              - {{name: sft_adapter, kind: sft, dataset: chat_rows, args: {{max_steps: 1}}}}
              - {{name: grpo_adapter, kind: grpo, dataset: prompts, rewards: [{{type: numeric}}],
                  args: {{max_steps: 1}}}}
              - {{name: merged_model, kind: merge}}
              - {{name: evaluation_report, kind: evaluate, dataset: report_rows, skills: [dragon_skills]}}
            """)
        )
    )
    return load(folder / "defs.yaml")


CHECK = AssetCheckKey(AssetKey(["contam", "merged_model"]), "evaluation_report_not_contaminated")
DATASETS = [
    AssetKey(["contam", name]) for name in ("chat", "questions", "tickets", "chat_rows", "prompts", "report_rows")
]


def run(pipeline, resources, with_report: bool = True):
    """The datasets, the check and (with_report) the report, in one run: as a whole pipeline's run orders them."""
    selection = AssetSelection.assets(*DATASETS) | AssetSelection.checks(CHECK)
    if with_report:
        selection |= AssetSelection.assets(AssetKey(["contam", "evaluation_report"]))
    parts = build_pipeline_defs(pipeline)
    job = define_asset_job("check_only", selection=selection)
    defs = Definitions(assets=parts["assets"], asset_checks=parts["asset_checks"], jobs=[job], resources=resources)
    instance = DagsterInstance.ephemeral()
    result = defs.resolve_job_def("check_only").execute_in_process(instance=instance, raise_on_error=False)
    [evaluation] = [e for e in result.get_asset_check_evaluations() if e.check_name == CHECK.name]
    made = {e.asset_key.path[-1] for e in result.get_asset_materialization_events()}
    return evaluation, made


def test_a_report_on_rows_a_training_split_holds_is_blocked_with_the_rows_named(tiny_model, tmp_path, resources_for):
    # the trained chat rows hold every GRPO prompt with its answer; the report's rows are the tickets split by
    # another seed than the trained one: some of its held-out tickets are trained on
    pipeline = pipeline_with(tmp_path / "defs" / "contam", tiny_model, questions(100, 20), report_seed=2)
    evaluation, made = run(pipeline, resources_for(tmp_path / "runs"), with_report=True)
    assert not evaluation.passed and evaluation.severity.value == "ERROR"
    assert "evaluation_report" not in made and {"chat_rows", "prompts", "report_rows"} <= made
    metadata = {k: v.value for k, v in evaluation.metadata.items()}
    by_set = metadata["by_evaluation_set"]
    # the GRPO stage's held-out prompts that the chat split trained on (the rest are in its held-out rows) ...
    assert by_set["prompts"]["checked"] == 10 and by_set["prompts"]["contaminated"] >= 5
    assert by_set["report_rows"]["contaminated"] > 0  # ... and the report's tickets split the other way
    assert all(by_set[f"skills_{task}"]["contaminated"] == 0 for task in ("copy", "order", "format", "arithmetic"))
    assert "of prompts ('What is 1" in evaluation.description and "in training row" in evaluation.description
    assert "allow_contamination: true on evaluation_report" in evaluation.description
    assert "| prompts |" in metadata["contaminated"] and metadata["contamination_seconds"] >= 0


def test_a_clean_pipeline_passes_and_its_report_is_made(materialized):
    # the session's whole tiny chain (conftest.py): one dataset, trained on and measured on its own held-out split
    [check] = [c for c in materialized["outcome"]["checks"] if c["name"] == "evaluation_report_not_contaminated"]
    assert check["passed"] and check["asset"] == "tiny/merged_model"
    assert materialized["outcome"]["report"] is not None
