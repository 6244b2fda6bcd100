"""GRPO with tools in the loop, through Dagster on a tiny model: the tools run (a counter file shows it), a tool
that raises and one past its timeout become answers the rollout goes on from, and the rewards score the final
answers while tool_call scores the calls."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tests.support import BUMP_TOOLS as TOOLS
from tests.support import COUNTING_BUMP

SEEN = """
from pathlib import Path


def reward(prompt, completion, reference, row):
    with Path({seen!r}).open("a") as f:
        f.write(completion.replace("\\n", " ") + "\\n")
    return 1.0 if "Done" in completion else 0.0
"""


def test_grpo_runs_the_pipelines_tools_in_its_rollouts(tool_caller, tmp_path, resources_for):
    from dagster import DagsterInstance

    from dragon_dagster.assets.launch import materialize_pipeline
    from dragon_dagster.engine.pipeline import load

    counter, seen = tmp_path / "counter.txt", tmp_path / "seen.txt"
    folder = tmp_path / "defs" / "tools_tiny"
    folder.mkdir(parents=True)
    (folder / "tools.py").write_text(TOOLS.format(counter=str(counter)))
    (folder / "seen_reward.py").write_text(SEEN.format(seen=str(seen)))
    # distinct rows (identical ones are deduplicated), the same question
    conversation = lambda i: [  # noqa: E731 - a held-out conversation the report replays
        {"role": "user", "content": "Check the counter"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "bump", "arguments": {}}}],
        },
        {"role": "tool", "name": "bump", "content": f"count {i}"},
        {"role": "assistant", "content": "Done."},
    ]
    (folder / "traces.jsonl").write_text("".join(json.dumps({"messages": conversation(i)}) + "\n" for i in range(20)))
    (folder / "prompts.csv").write_text("prompt,ticket\n" + "".join(f"Check the counter,{i}\n" for i in range(8)))
    (folder / "defs.yaml").write_text(
        textwrap.dedent(f"""\
        type: dragon_dagster.PostTrainingPipeline
        attributes:
          name: tools_tiny
          model: {tool_caller}
          tools: {{file: tools.py, timeout: 1, max_calls: 2}}
          datasets:
            prompts: {{path: prompts.csv}}
            traces: {{path: traces.jsonl}}
          stages:
            - {{name: counter_prompts, kind: prompt_dataset, source: prompts, prompt: prompt, reference: ticket,
                eval_frac: 0}}
            - name: grpo_adapter
              kind: grpo
              dataset: counter_prompts
              tools: true
              rewards: [{{type: tool_call}}, {{type: custom, file: seen_reward.py, name: seen}}]
              group_size: 2
              temperature: 0.05
              max_new_tokens: 64
              max_eval_prompts: 2
              n_samples: 1
              args: {{max_steps: 2, batch_size: 2, grad_accum: 1, logging_steps: 1, save_steps: 50}}
            - {{name: trace_dataset, kind: chat_dataset, source: traces, layout: messages, eval_frac: 0}}
            - {{name: merged_model, kind: merge}}
            - {{name: evaluation_report, kind: evaluate, dataset: trace_dataset, max_new_tokens: 24, n_samples: 1,
                max_eval_rows: 3}}
        """)
    )
    outcome = materialize_pipeline(
        load(folder / "defs.yaml"), resources=resources_for(tmp_path / "runs"), instance=DagsterInstance.ephemeral()
    )
    assert outcome["success"], outcome["stages"]
    art = Path(outcome["artifacts"]["grpo_adapter"])
    result = json.loads((art / "manifest.json").read_text())["result"]
    ran = len(counter.read_text().splitlines())
    tools = result["tools"]
    assert tools["names"] == ["bump"] and tools["rendering"] == "fallback"
    # every call reached the tool, including the ones it never answered normally; the report then replayed its
    # 3 conversations once per model, one call each
    assert ran == tools["calls"] + 2 * 3 and tools["calls"] >= 3 and tools["errors"] >= 1 and tools["timeouts"] >= 1
    assert (art / "tools" / "tools.py").exists()  # the artifact keeps the tools it was trained with
    # the rewards scored the answers given after the tool's result, never the call itself
    answers = seen.read_text().splitlines()
    assert answers and all("<tool_call>" not in a and "bump" not in a for a in answers)
    assert result["per_reward_after"]["tool_call"] == 1.0  # the greedy rollouts call bump, validly
    progress = [json.loads(line) for line in (art / "progress.jsonl").read_text().splitlines()]
    assert any(r.get("reward_tool_call") for r in progress)
    # the report replays the held-out conversations with the tools: both models call bump as they learned to
    report = json.loads((Path(outcome["artifacts"]["evaluation_report"]) / "report.json").read_text())
    for side in ("base", "merged"):
        figures = report[side]["tools"]
        assert figures["conversations"] == 3 and figures["call_correct"] == 1.0 and figures["tool_call_valid"] == 1.0
        assert 0 < figures["answer_token_f1"] <= 1  # its answer after a result (or an error) is mostly "Done."
    assert report["tool_use"]["paired"] == {"cases": 3, "only_base": 0, "only_merged": 0, "p_value": 1.0}
    assert "## Tool use" in (Path(outcome["artifacts"]["evaluation_report"]) / "report.md").read_text()


CONSTANT = "def reward(prompt, completion, reference, row):\n    return 1.5\n"


def test_a_stage_that_did_not_move_the_model_reads_no_measurable_change(tiny_model, tmp_path, resources_for):
    """SFT on every assistant turn with the tools, then GRPO whose reward is constant: every group has zero
    reward variance, so GRPO teaches nothing. The report scores each model of the chain through the template it
    was trained with, so the model after SFT scores what SFT itself measured on the same held-out rows, and GRPO
    is credited with nothing."""
    from dagster import DagsterInstance

    from dragon_dagster.assets.launch import materialize_pipeline
    from dragon_dagster.engine.pipeline import load

    folder = tmp_path / "defs" / "tools_flat"
    folder.mkdir(parents=True)
    (folder / "tools.py").write_text(COUNTING_BUMP.format(counter=str(tmp_path / "counter.txt")))
    (folder / "constant.py").write_text(CONSTANT)
    things = (  # held out: 8 of 24 rows, enough for the paired test to find a change (4 rows never can)
        "apples boxes crates parcels letters pallets bottles tickets coins keys cups plates forks spoons pens "
        "books bags hats shoes lamps chairs tables cards jars"
    ).split()

    def conversation(i: int, thing: str) -> list[dict]:  # a tool call, its result, an answer built on it
        return [
            {"role": "user", "content": f"How many {thing} are on the counter?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"type": "function", "function": {"name": "bump", "arguments": {}}}],
            },
            {"role": "tool", "name": "bump", "content": f"count {i}"},
            {"role": "assistant", "content": f"There are {i} {thing}."},
        ]

    (folder / "traces.jsonl").write_text(
        "".join(json.dumps({"messages": conversation(i, t)}) + "\n" for i, t in enumerate(things))
    )
    (folder / "prompts.csv").write_text("prompt\n" + "".join(f"Count the {t}\n" for t in things[:4]))
    (folder / "defs.yaml").write_text(
        textwrap.dedent(f"""\
        type: dragon_dagster.PostTrainingPipeline
        attributes:
          name: tools_flat
          model: {tiny_model}
          tools: {{file: tools.py, timeout: 1, max_calls: 1}}
          datasets:
            prompts: {{path: prompts.csv}}
            traces: {{path: traces.jsonl}}
          stages:
            - {{name: trace_dataset, kind: chat_dataset, source: traces, layout: messages, eval_frac: 0.34}}
            - name: sft_adapter
              kind: sft
              dataset: trace_dataset
              train_on: all_assistant_turns
              n_samples: 1
              max_new_tokens: 4
              args: {{max_steps: 3, batch_size: 3, grad_accum: 1, logging_steps: 1, save_steps: 50, max_seq_len: 512,
                      learning_rate: 5.0e-3}}
            - {{name: count_prompts, kind: prompt_dataset, source: prompts, prompt: prompt, eval_frac: 0}}
            - name: grpo_adapter
              kind: grpo
              dataset: count_prompts
              tools: true
              rewards: [{{type: custom, file: constant.py, name: constant}}]
              group_size: 2
              max_new_tokens: 8
              max_eval_prompts: 2
              n_samples: 1
              args: {{max_steps: 2, batch_size: 2, grad_accum: 1, logging_steps: 1, save_steps: 50}}
            - {{name: merged_model, kind: merge}}
            - {{name: evaluation_report, kind: evaluate, dataset: trace_dataset, max_new_tokens: 4, n_samples: 1,
                n_judge: 0}}
        """)
    )
    outcome = materialize_pipeline(
        load(folder / "defs.yaml"), resources=resources_for(tmp_path / "runs"), instance=DagsterInstance.ephemeral()
    )
    assert outcome["success"], outcome["stages"]
    art = {name: Path(path) for name, path in outcome["artifacts"].items()}
    sft = json.loads((art["sft_adapter"] / "manifest.json").read_text())["result"]
    grpo = json.loads((art["grpo_adapter"] / "manifest.json").read_text())["result"]
    assert sft["held_out"] and sft["rendering"] == "fallback" and grpo["tools"]["rendering"] == "fallback"
    flat = [json.loads(line) for line in (art["grpo_adapter"] / "groups.jsonl").read_text().splitlines()]
    assert flat and all(g["zero_std_frac"] == 1.0 for g in flat)  # no group had a reward to learn from
    report = json.loads((art["evaluation_report"] / "report.json").read_text())
    nll = {entry["model"]: entry["eval_loss"] for entry in report["stage_nll"]}
    assert list(nll) == ["base", "after sft_adapter", "after grpo_adapter"]
    # the model after SFT, scored by the report, is the model SFT measured: the same rows, the same template
    held_out = (art["trace_dataset"] / "eval.jsonl").read_text().splitlines()
    assert report["held_out"] and report["rows"] == len(held_out) >= 6
    assert nll["after sft_adapter"] == pytest.approx(sft["eval_loss"], rel=1e-4)
    assert nll["after grpo_adapter"] == report["merged"]["eval_loss"] == pytest.approx(sft["eval_loss"], rel=1e-4)
    changes = {c["stage"]: c for c in report["stage_changes"]}
    assert changes["sft_adapter"]["against"] == "base"
    assert changes["grpo_adapter"]["against"] == "after sft_adapter"
    assert changes["grpo_adapter"]["verdict"] == "no measurable change" and changes["grpo_adapter"]["p_value"] == 1.0
    markdown = (art["evaluation_report"] / "report.md").read_text().splitlines()
    [row] = [line for line in markdown if line.startswith("| grpo_adapter | after sft_adapter |")]
    assert row.endswith("| **no measurable change** |"), row
    from dragon_dagster.resources import MLflowTracking

    tracking = MLflowTracking(runs_dir=str(tmp_path / "runs"))  # every MLflow run the stages opened has ended
    for experiment in ("tools_flat", "tools_flat-evaluations"):
        runs = tracking.client().search_runs([tracking.experiment_id(experiment)])
        assert runs and {r.info.status for r in runs} == {"FINISHED"}, [(r.info.run_name, r.info.status) for r in runs]
