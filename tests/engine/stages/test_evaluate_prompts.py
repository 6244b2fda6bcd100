"""The evaluation report on a prompt dataset (issue 12, item 1): a GRPO-only pipeline is evaluated on its held-out
prompts with the GRPO stage's rewards, base against merged, without a loss; paths in the report are relative."""

import json
import textwrap
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterInstance

from dragon_dagster.assets.launch import materialize_pipeline
from dragon_dagster.engine.artifacts.manifest import AdapterManifest, ReportManifest, read_manifest
from dragon_dagster.engine.pipeline import load
from tests.support import component_yaml

STEPS = "{max_steps: 2, batch_size: 2, grad_accum: 1, logging_steps: 1, max_seq_len: 128, learning_rate: 1.0e-3}"


@pytest.fixture(scope="module")
def grpo_only(tiny_model, tmp_path_factory):
    from dragon_dagster.resources import ArtifactStore, MLflowTracking, TrainingResource

    root = tmp_path_factory.mktemp("report_prompts")
    path = root / "defs" / "arith" / "defs.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(
        component_yaml(
            textwrap.dedent(f"""\
        name: arith
        model: {tiny_model}
        stages:
          - {{name: prompts, kind: prompt_dataset, path: "example:arithmetic.csv", prompt: question,
              reference: answer}}
          - name: grpo_adapter
            kind: grpo
            dataset: prompts
            rewards: [{{type: numeric}}, {{type: length, max_chars: 16, weight: 0.2}}]
            group_size: 2
            args: {STEPS}
            n_samples: 1
            max_new_tokens: 6
            max_eval_prompts: 4
            temperature: 0.9
            pass_samples: 2
            pass_k: 2
          - {{name: merged_model, kind: merge}}
          - {{name: evaluation_report, kind: evaluate, dataset: prompts, max_new_tokens: 6, n_samples: 2,
              max_eval_rows: 6, n_judge: 0, pass_samples: 4, pass_k: 2}}
        """)
        )
    )
    runs = root / "runs"
    resources = {
        "store": ArtifactStore(runs_dir=str(runs)),
        "tracking": MLflowTracking(runs_dir=str(runs)),
        "training": TrainingResource(device="cpu"),
    }
    instance = DagsterInstance.ephemeral()
    outcome = materialize_pipeline(load(path), resources=resources, instance=instance)
    return {"outcome": outcome, "runs": runs, "tracking": resources["tracking"], "instance": instance}


def failures(grpo_only) -> str:
    from tests.support import failed_message

    return failed_message(grpo_only["instance"], grpo_only["outcome"]["run_id"])


def test_a_grpo_only_pipeline_is_reported_on_its_prompts_with_its_rewards(grpo_only):
    outcome = grpo_only["outcome"]
    assert outcome["success"], failures(grpo_only)
    art = Path(outcome["artifacts"]["evaluation_report"])
    report = json.loads((art / "report.json").read_text())
    assert report["task"] == "prompts" and report["held_out"] is True and report["rows"] == 6
    assert "6 held-out prompts" in report["computed_on"]["rewards"]
    for side in ("base", "merged"):
        figures = report[side]
        assert figures["eval_loss"] is None and figures["perplexity"] is None, "no loss without reference replies"
        assert set(figures["rewards"]) == {"numeric", "length"}
        assert all(0.0 <= v <= 1.0 for v in figures["rewards"].values())
        assert set(figures["accuracy"]) == {"numeric"}, "a share scoring 1 only for accuracy-like rewards"
        assert 0.0 <= figures["accuracy"]["numeric"] <= 1.0
        expected = figures["rewards"]["numeric"] + 0.2 * figures["rewards"]["length"]
        assert figures["reward"] == pytest.approx(expected)
        assert set(figures["metrics"]) >= {"numeric", "exact"}, "task metrics against the reference too"
    assert report["merged_not_worse"] == (report["merged"]["reward"] >= report["base"]["reward"] - 1e-6)
    assert {r["name"]: (r["type"], r["weight"], r["stage"]) for r in report["rewards"]} == {
        "numeric": ("numeric", 1.0, "grpo_adapter"),
        "length": ("length", 0.2, "grpo_adapter"),
    }
    assert len(report["samples"]) == 2
    for sample in report["samples"]:
        assert sample["prompt"].startswith("What is") and sample["reference"]
        assert {"base", "merged", "base_reward", "merged_reward"} <= set(sample)
    assert report["stages"][0]["stage"] == "grpo_adapter" and "reward_after" in report["stages"][0]
    # paths in the artifact are final or relative, never the staging directory
    assert report["loss_plot"] == "loss.png" and (art / report["loss_plot"]).exists()
    assert ".tmp-" not in (art / "report.json").read_text()
    md = (art / "report.md").read_text()
    assert "6 held-out prompts" in md and "| numeric |" in md and "share scoring 1" in md
    assert "Loss and perplexity: absent" in md


def test_pass_at_k_merged_against_base_and_the_grpo_stage_against_its_start(grpo_only):
    art = Path(grpo_only["outcome"]["artifacts"]["evaluation_report"])
    report = json.loads((art / "report.json").read_text())
    stage, merged = report["pass_at_k"]
    # the GRPO stage's own, from its result: its held-out prompts, its samples
    assert (stage["model"], stage["against"], stage["reward"]) == ("grpo_adapter", "start", "numeric")
    assert (stage["prompts"], stage["samples"], stage["k"], stage["temperature"]) == (4, 2, 2, 0.9)
    # the report's own: the same 6 prompts sampled 4 times by base and merged, at the GRPO stage's temperature
    assert (merged["model"], merged["against"], merged["reward"]) == ("merged", "base", "numeric")
    assert (merged["prompts"], merged["samples"], merged["k"], merged["temperature"]) == (6, 4, 2, 0.9)
    for change in (stage, merged):
        for when in ("before", "after"):
            right = change[f"pass1_{when}"] * change["prompts"] * change["samples"]
            assert right == pytest.approx(round(right)), "pass@1 is a share of the samples"
            assert 0 <= change[f"pass1_{when}"] <= change[f"passk_{when}"] <= 1
        assert change["prompts_up"] + change["prompts_down"] <= change["prompts"]
        assert change["verdict"] in ("better", "worse", "no measurable change")
    md = (art / "report.md").read_text()
    assert "## pass@1 and pass@k" in md
    assert (
        f"| merged | base | numeric | 6 x 4 | 0.9 | {merged['pass1_before']:.3f} -> {merged['pass1_after']:.3f} |" in md
    )
    assert f"**{stage['verdict']}** |" in md and "| grpo_adapter | its start | numeric | 4 x 2 |" in md
    # and `dragon demo` says each in a line, with its verdict
    from dragon_dagster.cli.demo import pass_at_k_lines

    said = pass_at_k_lines(str(art))
    assert said[0].startswith("pass@k: grpo_adapter against its start, numeric on 4 held-out prompts x 2 samples")
    assert said[1].startswith("pass@k: merged against base, numeric on 6 held-out prompts x 4 samples: pass@1 ")
    assert said[1].endswith(f"p = {merged['p_value']:.3g}): {merged['verdict']}")


def test_mlflow_compares_rewards_on_the_base_and_report_runs_without_a_loss(grpo_only):
    from mlflow import MlflowClient

    art = Path(grpo_only["outcome"]["artifacts"]["evaluation_report"])
    manifest = read_manifest(art, ReportManifest)
    client = MlflowClient(grpo_only["tracking"].uri)
    report = json.loads((art / "report.json").read_text())
    for run_id, side in ((manifest.base_mlflow_run_id, "base"), (manifest.mlflow_run_id, "merged")):
        metrics = client.get_run(run_id).data.metrics
        assert {"eval/reward", "eval/reward_numeric", "eval/reward_length", "eval/accuracy_numeric"} <= set(metrics)
        assert metrics["eval/reward_numeric"] == pytest.approx(report[side]["rewards"]["numeric"])
        assert "eval/loss" not in metrics and "eval/perplexity" not in metrics
        # pass@k under the names the GRPO stage logs its own: base's on the base run, merged's on the report's
        (change,) = [c for c in report["pass_at_k"] if c["against"] == "base"]
        when = "before" if side == "base" else "after"
        assert metrics["eval/pass_at_1_numeric"] == pytest.approx(change[f"pass1_{when}"])
        assert metrics["eval/pass_at_2_numeric"] == pytest.approx(change[f"passk_{when}"])
    # and the GRPO stage's own on its run, after and before (MLflow refuses '@' in a name: none is lost)
    grpo = read_manifest(Path(grpo_only["outcome"]["artifacts"]["grpo_adapter"]), AdapterManifest)
    metrics = client.get_run(grpo.mlflow_run_id).data.metrics
    (change,) = [c for c in report["pass_at_k"] if c["against"] == "start"]
    assert metrics["eval/pass_at_1_numeric"] == pytest.approx(change["pass1_after"])
    assert metrics["eval/before_pass_at_2_numeric"] == pytest.approx(change["passk_before"])


def test_the_asset_metadata_shows_each_reward_base_against_merged(grpo_only):
    event = grpo_only["instance"].get_latest_materialization_event(AssetKey(["arith", "evaluation_report"]))
    metadata = event.asset_materialization.metadata
    for name in ("reward", "reward_numeric", "reward_length", "accuracy_numeric"):
        assert f"base/eval/{name}" in metadata and f"merged/eval/{name}" in metadata, name
    assert "base_eval_loss" not in metadata
    assert "| numeric |" in metadata["rewards"].value
    assert "| merged | base | numeric | 6 x 4 |" in metadata["pass_at_k"].value
