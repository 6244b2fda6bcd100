"""Preflight: a data problem anywhere in the pipeline stops every training stage before it trains."""

import textwrap

from dagster import DagsterInstance

from dragon_dagster.assets.launch import materialize_pipeline
from dragon_dagster.engine.data.stage import columns_of
from dragon_dagster.engine.pipeline import load
from dragon_dagster.engine.pipeline.preflight import problems
from tests.support import component_yaml

STEPS = "{max_steps: 2, batch_size: 2, grad_accum: 1, logging_steps: 1, save_steps: 100, max_seq_len: 128}"


def pipeline_yaml(tmp_path, model, prompt_column: str, reference: str = "reference: answer"):
    path = tmp_path / "p" / "defs.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        component_yaml(
            textwrap.dedent(f"""\
        name: pre
        model: {model}
        datasets: {{tickets: {{path: "example:tickets.csv"}}}}
        stages:
          - {{name: sft_dataset, kind: chat_dataset, source: tickets, prompt: "{{subject}}", response: reply}}
          - {{name: sft_adapter, kind: sft, dataset: sft_dataset, args: {STEPS}, n_samples: 1, max_new_tokens: 4}}
          - {{name: prompts, kind: prompt_dataset, path: "example:arithmetic.csv", prompt: {prompt_column},
              {reference}}}
          - {{name: grpo_adapter, kind: grpo, dataset: prompts, rewards: [{{type: numeric}}], args: {STEPS}}}
        """)
        )
    )
    return path


def test_problems_name_the_stage_the_column_and_the_file(tmp_path):
    assert columns_of(load(pipeline_yaml(tmp_path, "m", "question")).datasets["tickets"].path)[:2] == [
        "subject",
        "body",
    ]
    assert problems(load(pipeline_yaml(tmp_path, "m", "question"))) == []
    [found] = problems(load(pipeline_yaml(tmp_path, "m", "questoin")))
    assert (
        found.startswith("prompts: prompt 'questoin' names missing column(s) ['questoin']; ")
        and "arithmetic.csv" in found
    )
    system, reference = problems(load(pipeline_yaml(tmp_path, "m", "question", reference="system: '{topic}'")))
    assert system.startswith("prompts: system '{topic}' names missing column(s) ['topic']")
    assert reference == (
        "grpo_adapter: reward(s) ['numeric'] compare with a reference, but prompts maps no reference column"
    )


def test_a_missing_column_in_a_later_dataset_stops_training_before_it_starts(tiny_model, tmp_path, resources_for):
    instance = DagsterInstance.ephemeral()
    outcome = materialize_pipeline(
        load(pipeline_yaml(tmp_path, tiny_model, "questoin")),
        resources=resources_for(tmp_path / "runs"),
        instance=instance,
    )
    statuses = {s["asset"]: s["status"] for s in outcome["stages"]}
    assert statuses["pre/sft_dataset"] == "SUCCESS" and statuses["pre/sft_adapter"] == "FAILURE"
    assert "pre/sft_adapter" not in {f"pre/{k}" for k in outcome["artifacts"]}
    from dagster import DagsterEventType

    failures = instance.get_records_for_run(outcome["run_id"], of_type=DagsterEventType.STEP_FAILURE).records
    messages = " ".join(str(r.event_log_entry.dagster_event.event_specific_data.error) for r in failures)
    assert "sft_adapter: preflight found problems in the pipeline's data; nothing was trained" in messages
    assert "'questoin'" in messages
    assert not list((tmp_path / "runs" / "checkpoints").rglob("checkpoint-*")), "no step was trained"
