"""A learned reward through Dagster on the tiny model: pairs -> reward_model -> grpo optimizing it beside a numeric
reward -> rloo on the same two. The reward model is an input of the GRPO and RLOO assets (lineage edges), its
held-out accuracy reaches MLflow, each stage scores its rollouts with it and watches a guard it was not trained
on, and the RLOO stage (TRL's RLOOTrainer) continues from the GRPO one with the same checks."""

from __future__ import annotations

import json
import re
import signal
import textwrap
from pathlib import Path

import pytest

PAIRS = "".join(
    f"What is {a} + {b}?,{a} plus {b} is {a + b}. Thanks for asking!,no idea about {a} and {b}\n"
    for a in range(2, 14)
    for b in (3, 7)
)
PROMPTS = "".join(f"What is {a} + {b}? Reply with just the number.,{a + b}\n" for a in range(1, 9) for b in (2, 5))


@pytest.fixture(autouse=True)
def signal_handlers_kept():
    """Something this test runs in-process (the in-process Dagster run or the CLI around it) leaves SIGTERM mapped to
    KeyboardInterrupt; the later tests that signal this process (the chat's Ctrl-C, the run launcher's terminate)
    need the handlers as they were."""
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for number, handler in handlers.items():
        signal.signal(number, handler)


def write_rlhf_pipeline(folder: Path, model: Path, guard: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "prefs.csv").write_text("question,good,bad\n" + PAIRS)
    (folder / "prompts.csv").write_text("q,a\n" + PROMPTS)
    args = (
        "{max_steps: 6, batch_size: 4, grad_accum: 1, logging_steps: 2, save_steps: 50, max_seq_len: 128, "
        "learning_rate: 5.0e-3}"
    )
    (folder / "defs.yaml").write_text(
        textwrap.dedent(f"""\
        type: dragon_dagster.PostTrainingPipeline
        attributes:
          name: rlhf_tiny
          model: {model}
          datasets:
            prefs: {{path: prefs.csv}}
            prompts: {{path: prompts.csv}}
          stages:
            - {{name: pref_pairs, kind: pairs_dataset, source: prefs, prompt: question, chosen: good, rejected: bad,
                eval_frac: 0.25}}
            - {{name: taste_model, kind: reward_model, dataset: pref_pairs, args: {args}, min_accuracy: 0.5}}
            - {{name: sum_prompts, kind: prompt_dataset, source: prompts, prompt: q, reference: a, eval_frac: 0.25}}
            - name: grpo_adapter
              kind: grpo
              dataset: sum_prompts
              rewards: [{{type: reward_model, stage: taste_model, name: taste}}, {{type: numeric, weight: 0.5}}]
              {guard}
              group_size: 2
              max_new_tokens: 8
              max_eval_prompts: 4
              n_samples: 1
              args: {{max_steps: 2, batch_size: 2, grad_accum: 1, logging_steps: 1, save_steps: 50}}
            - name: rloo_adapter
              kind: rloo
              dataset: sum_prompts
              rewards: [{{type: reward_model, stage: taste_model, name: taste}}, {{type: numeric, weight: 0.5}}]
              group_size: 2
              max_new_tokens: 8
              max_eval_prompts: 4
              n_samples: 1
              reward_clip_range: [-3, 3]
              args: {{max_steps: 2, batch_size: 2, grad_accum: 1, logging_steps: 1, save_steps: 50}}
            - {{name: merged_model, kind: merge}}
        """)
    )
    return folder / "defs.yaml"


def test_pairs_reward_model_grpo_through_dagster(tiny_model, tmp_path, resources_for):
    from dagster import AssetKey, DagsterInstance, Definitions

    from dragon_dagster.assets.factory import build_pipeline_defs
    from dragon_dagster.assets.launch import materialize_pipeline
    from dragon_dagster.engine.pipeline import load

    pipeline = load(write_rlhf_pipeline(tmp_path / "defs" / "rlhf_tiny", tiny_model))
    # the lineage edges: the GRPO and RLOO adapters read the reward model; the merge folds the policy's adapters
    parts = build_pipeline_defs(pipeline)
    defs = Definitions(assets=parts["assets"], resources=resources_for(tmp_path / "runs"))
    graph = defs.resolve_asset_graph()
    deps = graph.get(AssetKey(["rlhf_tiny", "grpo_adapter"])).parent_keys
    assert AssetKey(["rlhf_tiny", "taste_model"]) in deps and AssetKey(["rlhf_tiny", "sum_prompts"]) in deps
    rloo_deps = graph.get(AssetKey(["rlhf_tiny", "rloo_adapter"])).parent_keys
    assert rloo_deps == {AssetKey(["rlhf_tiny", n]) for n in ("taste_model", "sum_prompts", "grpo_adapter")}
    assert graph.get(AssetKey(["rlhf_tiny", "merged_model"])).parent_keys == {AssetKey(["rlhf_tiny", "rloo_adapter"])}

    runs = tmp_path / "runs"
    outcome = materialize_pipeline(pipeline, resources=resources_for(runs), instance=DagsterInstance.ephemeral())
    assert outcome["success"], outcome["stages"]

    rm_dir = Path(outcome["artifacts"]["taste_model"])
    rm = json.loads((rm_dir / "manifest.json").read_text())
    assert rm["method"] == "reward_model" and rm["result"]["eval_pairs"] == 6
    # a signal the tiny model can see (chosen replies thank, rejected ones shrug): the saved adapter and head,
    # loaded as a GRPO stage loads them, rank the held-out pairs (a head lost in saving would rank by chance)
    assert rm["result"]["accuracy"] >= 5 / 6 and rm["result"]["margin"] > 0 and (rm_dir / "scores.png").exists()
    assert (rm_dir / "adapter" / "adapter_config.json").exists()
    adapter_config = json.loads((rm_dir / "adapter" / "adapter_config.json").read_text())
    assert adapter_config["task_type"] == "SEQ_CLS" and "score" in adapter_config["modules_to_save"]
    samples = [json.loads(line) for line in (rm_dir / "samples.jsonl").read_text().splitlines()]
    assert samples and {"score_chosen", "score_rejected"} <= set(samples[0])

    client = resources_for(runs)["tracking"].client()  # never mlflow's process-wide URI: later tests read theirs
    run = client.get_run(rm["mlflow_run_id"])
    assert run.data.metrics["eval/rm_accuracy"] == pytest.approx(rm["result"]["accuracy"])
    assert "eval/rm_margin" in run.data.metrics and run.data.tags["method"] == "reward_model"

    grpo_dir = Path(outcome["artifacts"]["grpo_adapter"])
    grpo = json.loads((grpo_dir / "manifest.json").read_text())
    job = json.loads((grpo_dir / "job.json").read_text())
    assert [m["stage"] for m in job["inputs"]["reward_models"]] == ["taste_model"]
    assert grpo["chain"] == [str(grpo_dir / "adapter")]  # started from the base: the reward model is no link
    result = grpo["result"]
    assert result["reward_kinds"] == {"taste": "reward_model", "numeric": "numeric"}
    # the rollouts were scored by the reward model (normalized in each group: a mean near 0)
    progress = [json.loads(line) for line in (grpo_dir / "progress.jsonl").read_text().splitlines()]
    assert any("reward_taste" in r for r in progress)
    assert all(abs(r["reward_taste"]) < 1e-5 for r in progress if "reward_taste" in r)
    # held-out before and after: raw scores, and the guard the stage never trained on (references: token_f1)
    assert set(result["per_reward_before"]) == {"taste", "numeric"}
    assert set(result["guard_after"]) == {"token_f1"} and set(result["guard_before"]) == {"token_f1"}
    grpo_run = client.get_run(grpo["mlflow_run_id"])
    assert grpo_run.data.tags["reward_model.taste_model.mlflow_run_id"] == rm["mlflow_run_id"]
    assert "eval/guard_token_f1" in grpo_run.data.metrics

    # RLOO: the same rewards through TRL's RLOOTrainer, continuing from the GRPO adapter, the same checks run
    rloo_dir = Path(outcome["artifacts"]["rloo_adapter"])
    rloo = json.loads((rloo_dir / "manifest.json").read_text())
    rloo_job = json.loads((rloo_dir / "job.json").read_text())
    assert rloo["method"] == "rloo" and rloo["chain"] == [str(grpo_dir / "adapter"), str(rloo_dir / "adapter")]
    assert [m["stage"] for m in rloo_job["inputs"]["reward_models"]] == ["taste_model"]
    taste = rloo_job["settings"]["rewards"][0]  # typed specs in the job, read back as models
    assert taste["type"] == "reward_model" and taste["stage"] == "taste_model" and taste["normalize"] == "group"
    assert rloo["result"]["reward_kinds"] == {"taste": "reward_model", "numeric": "numeric"}
    assert set(rloo["result"]["guard_after"]) == {"token_f1"} and rloo["result"]["loss_label"] == "RLOO loss"
    rloo_progress = [json.loads(line) for line in (rloo_dir / "progress.jsonl").read_text().splitlines()]
    assert {"reward_taste", "reward_numeric"} <= {k for r in rloo_progress for k in r}
    assert rloo["result"]["global_step"] == 2
    rloo_run = client.get_run(rloo["mlflow_run_id"])
    assert rloo_run.data.tags["method"] == "rloo" and "eval/reward_taste" in rloo_run.data.metrics
    assert rloo_run.data.tags["reward_model.taste_model.mlflow_run_id"] == rm["mlflow_run_id"]
    checks = {c["name"] for c in outcome["checks"] if c["asset"] == "rlhf_tiny/rloo_adapter"}
    assert {"kl_within_bound", "groups_have_reward_variance", "format_not_rising_while_accuracy_falls"} <= checks

    # `dragon score` loads the same artifact: the reply in the taste it learned ranks first
    from click.testing import CliRunner

    from dragon_dagster.cli import main

    out = CliRunner().invoke(
        main, ["score", str(rm_dir), "What is 20 + 3?", "no idea about 20 and 3", "20 plus 3 is 23. Thanks for asking!"]
    )
    assert out.exit_code == 0, out.output
    ranked = [line.split("  ", 1)[1] for line in out.output.splitlines() if re.match(r"[+-]\d", line)]
    assert ranked == ["20 plus 3 is 23. Thanks for asking!", "no idea about 20 and 3"]
    refused = CliRunner().invoke(main, ["score", str(grpo_dir), "q", "a"])
    assert refused.exit_code != 0 and "not a reward model" in refused.output
