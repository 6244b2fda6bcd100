"""Every stage kind chained through Dagster on the tiny model: SFT -> synthesized pairs -> DPO -> GRPO (with a
custom reward file) -> merge -> report; ORPO on pairs from a file; bad preference and reward input."""

import json
import textwrap
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterInstance

from dragon_dagster.assets.launch import materialize_pipeline
from dragon_dagster.engine.artifacts.manifest import read_manifest
from dragon_dagster.engine.pipeline import load
from dragon_dagster.engine.runtime.execution import load_job
from tests.support import failed_message


def manifest_of(directory) -> dict:
    """An artifact's manifest as the mapping its JSON holds (every field, the kind's own ones too)."""
    return read_manifest(directory).model_dump()


STEPS = "{max_steps: 3, batch_size: 2, grad_accum: 1, logging_steps: 1, max_seq_len: 128, learning_rate: 1.0e-3}"


def chain_yaml(directory: Path, model: Path, extra_reward: str = "") -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "short_reward.py").write_text(
        "def reward(prompt, completion, reference, row):\n    return 1.0 if len(completion) < 12 else 0.0\n"
    )
    (directory / "chain.yaml").write_text(
        textwrap.dedent(f"""\
        name: chain
        model: {model}
        datasets:
          tickets: {{path: "example:tickets.csv"}}
        stages:
          - {{name: sft_dataset, kind: chat_dataset, source: tickets, prompt: "{{subject}}", response: reply}}
          - {{name: sft_adapter, kind: sft, dataset: sft_dataset, args: {STEPS}, n_samples: 2, max_new_tokens: 4}}
          - {{name: preference_pairs, kind: preference_pairs, dataset: sft_dataset, n: 25, max_new_tokens: 6,
              eval_frac: 0.2}}
          - {{name: dpo_adapter, kind: dpo, dataset: preference_pairs, args: {STEPS}, n_samples: 2,
              max_new_tokens: 4}}
          - {{name: arithmetic_prompts, kind: prompt_dataset, path: "example:arithmetic.csv", prompt: question,
              reference: answer}}
          - name: grpo_adapter
            kind: grpo
            dataset: arithmetic_prompts
            rewards: [{{type: numeric}}, {{type: length, max_chars: 16, weight: 0.2}},
                      {{type: custom, file: short_reward.py, name: short, weight: 0.1}}{extra_reward}]
            args: {STEPS}
            n_samples: 2
            max_new_tokens: 6
            max_eval_prompts: 6
          - {{name: merged_model, kind: merge}}
          - {{name: evaluation_report, kind: evaluate, dataset: sft_dataset, max_new_tokens: 4, n_samples: 2,
              n_judge: 2}}
        """)
    )


@pytest.fixture(scope="module")
def chain(tiny_model, tmp_path_factory):
    from dragon_dagster.resources import ArtifactStore, MLflowTracking, TrainingResource

    root = tmp_path_factory.mktemp("stages")
    chain_yaml(root / "pipelines", tiny_model)
    runs = root / "runs"
    resources = {
        "store": ArtifactStore(runs_dir=str(runs)),
        "tracking": MLflowTracking(runs_dir=str(runs)),
        "training": TrainingResource(device="cpu"),
    }
    instance = DagsterInstance.ephemeral()
    outcome = materialize_pipeline(load(root / "pipelines" / "chain.yaml"), resources=resources, instance=instance)
    return {"outcome": outcome, "runs": runs, "tracking": resources["tracking"], "instance": instance}


def test_every_stage_materializes_and_chains(chain):
    outcome = chain["outcome"]
    assert outcome["success"], [s for s in outcome["stages"] if s["status"] != "SUCCESS"]
    art = {k: Path(v) for k, v in outcome["artifacts"].items()}
    sft, dpo, grpo = (manifest_of(art[n]) for n in ("sft_adapter", "dpo_adapter", "grpo_adapter"))
    assert dpo["method"] == "dpo" and dpo["chain"] == sft["chain"] + [str(art["dpo_adapter"] / "adapter")]
    assert grpo["chain"] == dpo["chain"] + [str(art["grpo_adapter"] / "adapter")]
    assert manifest_of(art["merged_model"])["adapters"] == grpo["chain"]
    assert (
        dpo["upstream_mlflow_run_id"] == sft["mlflow_run_id"] and grpo["upstream_mlflow_run_id"] == dpo["mlflow_run_id"]
    )
    checks = {c["name"] for c in outcome["checks"]}
    assert {"kl_within_bound", "groups_have_reward_variance", "format_not_rising_while_accuracy_falls"} <= checks


def test_the_dpo_stage_scores_pairs_nothing_trained_on_and_the_contamination_check_passes(chain):
    """preference_pairs holds out pairs made from sft_dataset's held-out tickets, not from those SFT trained on
    (whose chosen reply is the SFT target), so the report's contamination check finds nothing."""
    art = chain["outcome"]["artifacts"]
    held_pairs = [json.loads(x) for x in (Path(art["preference_pairs"]) / "eval.jsonl").read_text().splitlines()]
    sft_held = [json.loads(x) for x in (Path(art["sft_dataset"]) / "eval.jsonl").read_text().splitlines()]
    assert held_pairs and {p["prompt"][-1]["content"] for p in held_pairs} <= {
        r["prompt"][-1]["content"] for r in sft_held
    }
    [check] = [c for c in chain["outcome"]["checks"] if c["name"] == "evaluation_report_not_contaminated"]
    assert check["passed"] and check["asset"] == "chain/merged_model", check["description"]
    assert chain["outcome"]["report"] is not None


def test_preference_pairs_come_from_the_students_samples(chain):
    art = Path(chain["outcome"]["artifacts"]["preference_pairs"])
    result = manifest_of(art)["result"]
    pairs = [json.loads(line) for line in (art / "pairs.jsonl").read_text().splitlines()]
    assert result["kept"] == len(pairs) > 0 and result["kept"] + sum(result["dropped"].values()) == 25
    assert all(p["chosen"][0]["content"] != p["rejected"][0]["content"] for p in pairs)
    assert len((art / "eval.jsonl").read_text().splitlines()) >= 1


def test_dpo_reports_preference_accuracy_and_logs_reward_metrics(chain):
    from mlflow import MlflowClient

    dpo = manifest_of(chain["outcome"]["artifacts"]["dpo_adapter"])
    assert 0.0 <= dpo["result"]["pref_accuracy"] <= 1.0 and "reward_margin" in dpo["result"]
    client = MlflowClient(chain["tracking"].uri)
    run = client.get_run(dpo["mlflow_run_id"])
    assert {
        "train/rewards/chosen",
        "train/rewards/rejected",
        "train/rewards/margins",
        "train/rewards/accuracies",
        "eval/pref_accuracy",
    } <= set(run.data.metrics)
    assert run.data.params["beta"] == "0.1" and run.data.tags["upstream_mlflow_run_id"]
    # its held-out objective is named for what it is, not logged as an `eval/loss` beside SFT's NLL
    assert "eval/dpo_loss" in run.data.metrics and "eval/loss" not in run.data.metrics
    assert "preference_loss" in dpo["result"] and "eval_loss" not in dpo["result"]


def test_grpo_logs_progress_columns_and_measures_before_and_after(chain):
    from mlflow import MlflowClient

    art = Path(chain["outcome"]["artifacts"]["grpo_adapter"])
    manifest = manifest_of(art)
    rows = [json.loads(line) for line in (art / "progress.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "reward" in r]
    assert len(trained) == 3
    for column in ("reward", "reward_std", "kl", "completion_len", "reward_numeric", "reward_length", "reward_short"):
        assert column in trained[0], column
    result = manifest["result"]
    assert set(result["per_reward_before"]) == {"numeric", "length", "short"} and result["eval_prompts"] == 6
    assert (art / "rewards" / "short_reward.py").exists(), "the custom reward file travels with the run"
    groups = [json.loads(line) for line in (art / "groups.jsonl").read_text().splitlines()]
    assert {g["reward"] for g in groups} == {"numeric", "length", "short"}  # per-reward group variance
    assert all(0.0 <= g["zero_std_frac"] <= 1.0 for g in groups)
    job = json.loads((art / "job.json").read_text())
    assert job["settings"]["group_size"] == 4 and job["settings"]["rewards"][2]["file"] == "rewards/short_reward.py"
    for name in ("preference_pairs", "dpo_adapter", "grpo_adapter"):  # each job file is what the worker reads
        written = json.loads((Path(chain["outcome"]["artifacts"][name]) / "job.json").read_text())
        assert load_job(written)[0].settings.model_dump() == written["settings"]
    run = MlflowClient(chain["tracking"].uri).get_run(manifest["mlflow_run_id"])
    assert {"train/reward", "train/kl", "train/rewards/numeric/mean", "eval/reward_before", "eval/reward"} <= set(
        run.data.metrics
    )


def test_report_adds_stage_figures_and_a_position_swapped_judge(chain):
    report = json.loads((Path(chain["outcome"]["artifacts"]["evaluation_report"]) / "report.json").read_text())
    assert [s["stage"] for s in report["stages"]] == ["sft_adapter", "dpo_adapter", "grpo_adapter"]
    assert "pref_accuracy" in report["stages"][1] and "reward_after" in report["stages"][2]
    assert {"reward_before/numeric", "reward_after/numeric", "reward_after/length"} <= set(report["stages"][2])
    # like with like: every stage's model on the same held-out rows, the last one being the merged model
    nll = report["stage_nll"]
    assert [s["model"] for s in nll] == ["base", "after sft_adapter", "after dpo_adapter", "after grpo_adapter"]
    assert nll[0]["eval_loss"] == report["base"]["eval_loss"] and nll[-1]["eval_loss"] == report["merged"]["eval_loss"]
    assert all(s["eval_loss"] > 0 for s in nll) and len({s["eval_loss"] for s in nll}) == 4
    assert "preference_loss" in report["stages"][1] and "eval_loss" not in report["stages"][1]
    markdown = (Path(chain["outcome"]["artifacts"]["evaluation_report"]) / "report.md").read_text()
    assert "Held-out loss after each stage" in markdown and "| after dpo_adapter |" in markdown
    # did each stage help: each against the model before it, row by row, with the paired test's verdict
    changes = report["stage_changes"]
    assert [(c["stage"], c["against"]) for c in changes] == [
        ("sft_adapter", "base"),
        ("dpo_adapter", "after sft_adapter"),
        ("grpo_adapter", "after dpo_adapter"),
    ]
    for change in changes:
        assert change["rows"] == report["rows"] and 0 <= change["p_value"] <= 1
        assert change["verdict"].startswith(("better", "worse", "no measurable change"))
        assert change["mean_before"] > 0 and change["mean_after"] > 0
    assert changes[1]["mean_before"] == changes[0]["mean_after"]  # one model's rows, the same both times
    assert "Did each stage help?" in markdown and f"**{changes[0]['verdict']}**" in markdown
    assert "row_nll" not in json.dumps(nll) and "row_nll" not in report["base"]  # the report keeps the figures
    assert "None" not in markdown  # a figure that does not exist says n/a
    from mlflow import MlflowClient

    report_run = MlflowClient(chain["tracking"].uri).get_run(
        manifest_of(chain["outcome"]["artifacts"]["evaluation_report"])["mlflow_run_id"]
    )
    # each stage's held-out NLL charts as one line over the chain on the pipeline run, its steps named by its tag,
    # not as a single-bar chart per stage
    assert not [k for k in report_run.data.metrics if k.startswith("stage_nll/")]
    client = MlflowClient(chain["tracking"].uri)
    parent = client.get_run(report_run.data.tags["mlflow.parentRunId"])
    chain_order = ["base", "sft_adapter", "dpo_adapter", "grpo_adapter", "merged"]
    assert parent.data.tags["chain"] == " -> ".join(f"{i} {name}" for i, name in enumerate(chain_order))
    series = {m.step: m.value for m in client.get_metric_history(parent.info.run_id, "heldout/nll")}
    # a figure only base and merged have (a task metric) is the merged model's one point, not a line drawn
    # across the stages between, which nothing measured
    only_ends = [
        k for k in parent.data.metrics if k.startswith("heldout/") and k not in ("heldout/nll", "heldout/perplexity")
    ]
    assert only_ends and all(
        [m.step for m in client.get_metric_history(parent.info.run_id, k)] == [4] for k in only_ends
    ), only_ends
    by_stage = {s.get("stage"): s["eval_loss"] for s in nll}
    assert [series[i] for i in (1, 2, 3)] == pytest.approx([by_stage[n] for n in chain_order[1:4]])
    for against in ("vs_base", "vs_first_stage"):
        figures = report["judge"][against]
        assert figures["n"] == 2 and figures["wins"] + figures["ties"] + figures["losses"] + figures["unparsed"] == 2


def run_small(tmp_path, tiny_model, resources_for, yaml_text: str):
    (tmp_path / "p").mkdir(exist_ok=True)
    (tmp_path / "p" / "small.yaml").write_text(textwrap.dedent(yaml_text).replace("MODEL", str(tiny_model)))
    instance = DagsterInstance.ephemeral()
    outcome = materialize_pipeline(
        load(tmp_path / "p" / "small.yaml"), resources=resources_for(tmp_path / "runs"), instance=instance
    )
    return outcome, instance


def test_orpo_on_pairs_from_a_file_continues_from_sft(tiny_model, tmp_path, resources_for):
    import pandas as pd

    df = pd.read_csv(Path(__file__).resolve().parents[2] / "dragon_dagster" / "example_data" / "tickets.csv").head(30)
    df.assign(bad=df["product"] + " is not supported.").to_parquet(tmp_path / "pairs.parquet")
    outcome, instance = run_small(
        tmp_path,
        tiny_model,
        resources_for,
        f"""\
        name: small
        model: MODEL
        datasets:
          tickets: {{path: "example:tickets.csv"}}
          pairs_file: {{path: "{tmp_path / "pairs.parquet"}"}}
        stages:
          - {{name: sft_dataset, kind: chat_dataset, source: tickets, prompt: subject, response: reply}}
          - {{name: sft_adapter, kind: sft, dataset: sft_dataset, args: {STEPS}, n_samples: 1, max_new_tokens: 2}}
          - {{name: pairs, kind: pairs_dataset, source: pairs_file, prompt: "{{subject}}", chosen: reply,
              rejected: bad, eval_frac: 0.2}}
          - {{name: orpo_adapter, kind: orpo, dataset: pairs, args: {STEPS}, n_samples: 1,
              max_new_tokens: 2}}
        """,
    )
    assert outcome["success"]
    manifest = manifest_of(outcome["artifacts"]["orpo_adapter"])
    event = instance.get_latest_materialization_event(AssetKey(["small", "pairs"]))
    assert manifest["method"] == "orpo" and len(manifest["chain"]) == 2
    assert manifest["result"]["eval_pairs"] == event.asset_materialization.metadata["eval_rows"].value > 0
    # 30 rows, 6 held out by prompt (rows sharing a subject stay on one side, so the held-out share is whole)
    metadata = event.asset_materialization.metadata
    assert metadata["train_rows"].value + metadata["eval_rows"].value == 30 - metadata["duplicates_dropped"].value
    assert metadata["prompt_overlap"].value == 0.0


def test_a_reward_that_needs_a_reference_fails_before_training(tiny_model, tmp_path, resources_for):
    outcome, instance = run_small(
        tmp_path,
        tiny_model,
        resources_for,
        f"""\
        name: small
        model: MODEL
        stages:
          - {{name: prompts, kind: prompt_dataset, path: "example:arithmetic.csv", prompt: question}}
          - {{name: grpo_adapter, kind: grpo, dataset: prompts, rewards: [{{type: numeric}}], args: {STEPS}}}
        """,
    )
    assert not outcome["success"]
    # the preflight names it before the stage loads anything
    assert "reward(s) ['numeric'] compare with a reference, but prompts maps no reference column" in failed_message(
        instance, outcome["run_id"]
    )
    assert not list((tmp_path / "runs" / "artifacts" / "small").glob("grpo_adapter/*"))


def test_a_reward_file_without_the_function_is_named(tiny_model, tmp_path, resources_for):
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "nothing.py").write_text("def score(x):\n    return 1\n")
    outcome, instance = run_small(
        tmp_path,
        tiny_model,
        resources_for,
        f"""\
        name: small
        model: MODEL
        stages:
          - {{name: prompts, kind: prompt_dataset, path: "example:arithmetic.csv", prompt: question, reference: answer}}
          - {{name: grpo_adapter, kind: grpo, dataset: prompts, rewards: [{{type: custom, file: nothing.py}}],
              args: {STEPS}}}
        """,
    )
    assert not outcome["success"]
    message = failed_message(instance, outcome["run_id"])
    assert "nothing.py" in message and "reward" in message
