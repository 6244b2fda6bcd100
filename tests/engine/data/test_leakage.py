"""Held-out rows that leak into training (issue 12, item 2) and task metrics that fit the task (item 3)."""

import json
import textwrap
from pathlib import Path

import pandas as pd
import pytest
from dagster import DagsterInstance

from dragon_dagster.engine.data import holdout, row_mapping, tables
from dragon_dagster.engine.evaluate.replies import choose_metrics
from dragon_dagster.engine.stages.sft.settings import SFT
from tests.support import component_yaml

STEPS = "{max_steps: 2, batch_size: 2, grad_accum: 1, logging_steps: 1, max_seq_len: 64}"
COUNTRIES = [
    "France",
    "Italy",
    "Spain",
    "Japan",
    "Egypt",
    "Peru",
    "Chile",
    "Kenya",
    "Norway",
    "Greece",
    "India",
    "Canada",
    "Mexico",
    "Poland",
    "Cuba",
]


def paraphrased_csv(path: Path) -> Path:
    """Each country asked two ways with the same answer, and the first 5 rows repeated word for word. The answer is
    long enough to identify its row (holdout.IDENTIFYING_ANSWER_WORDS): held out, it is a leak, not a coincidence."""
    rows = [
        {"question": q.format(c), "answer": f"The capital of {c} is the seat of its government.", "country": c}
        for c in COUNTRIES
        for q in ("What is the capital of {}?", "Name the capital city of {}.")
    ]
    pd.DataFrame(rows + rows[:5]).to_csv(path, index=False)
    return path


def test_group_by_keeps_each_group_on_one_side():
    rows = [
        {"prompt": [{"role": "user", "content": f"q{i}"}], "completion": [{"role": "assistant", "content": "a"}]}
        for i in range(60)
    ]
    groups = [f"g{i % 12}" for i in range(60)]
    train, held = holdout.split_rows(rows, 0.2, 42, groups)
    side = {}
    for row, group in zip(rows, groups):
        side.setdefault(group, set()).add(row in held)
    assert all(len(s) == 1 for s in side.values()), "no group is split"
    assert held and train and len(held) % 5 == 0 and abs(len(held) - 12) <= 5
    assert holdout.split_rows(rows, 0.2, 42) == holdout.split_rows(rows, 0.2, 42, list(range(60)))  # per-row as before


def test_duplicates_dropped_and_overlap_measured(tmp_path):
    df = tables.read_table(paraphrased_csv(tmp_path / "caps.csv"))
    rows = row_mapping.map_rows(df, row_mapping.Mapping("question", "answer"))
    kept, _, dropped = holdout.dedupe_rows(rows)
    assert (len(rows), len(kept), dropped) == (35, 30, 5)
    train, held = holdout.split_rows(kept, 0.2, 42)
    leak = holdout.overlap(train, held)
    assert leak["prompt_overlap"] == 0.0 and leak["answer_overlap"] > 0.5  # paraphrases share the answer
    train, held = holdout.split_rows(kept, 0.2, 42, holdout.group_values(df, "{country}")[:30])
    assert set(holdout.overlap(train, held).values()) == {0.0}


def test_metric_defaults_follow_the_references_and_names_are_checked():
    assert choose_metrics(["Paris", "Rome", "Lima"]) == ["exact", "contains", "token_f1", "length_ratio"]
    assert "numeric" in choose_metrics(["97", "12", "40"]) and "json_valid" not in choose_metrics(["97", "12"])
    assert "json_valid" in choose_metrics(['{"a": 1}', "[1, 2]", "x"])
    assert choose_metrics(["97"], ["exact", "token_f1"]) == ["exact", "token_f1"]
    with pytest.raises(ValueError, match="unknown metric"):
        SFT(name="s", kind="sft", dataset="d", metrics=["exactly"])


@pytest.fixture(scope="module")
def leaky_run(tiny_model, tmp_path_factory):
    from dragon_dagster.assets.launch import materialize_pipeline
    from dragon_dagster.engine.pipeline import load
    from dragon_dagster.resources import ArtifactStore, MLflowTracking, TrainingResource

    root = tmp_path_factory.mktemp("leak")
    paraphrased_csv(root / "caps.csv")
    path = root / "defs" / "leak" / "defs.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(
        component_yaml(
            textwrap.dedent(f"""\
        name: leak
        model: {tiny_model}
        datasets: {{caps: {{path: "{root / "caps.csv"}"}}}}
        stages:
          - {{name: allowed, kind: chat_dataset, source: caps, prompt: question, response: answer, eval_frac: 0.2,
              allow_leakage: true}}
          - {{name: allowed_sft, kind: sft, dataset: allowed, args: {STEPS}, n_samples: 3, max_new_tokens: 4}}
          - {{name: merged, kind: merge}}
          - {{name: report, kind: evaluate, dataset: allowed, n_samples: 1, max_new_tokens: 4, n_judge: 0,
              metrics: [exact, token_f1]}}
          - {{name: leaky, kind: chat_dataset, source: caps, prompt: question, response: answer, eval_frac: 0.2}}
          - {{name: leaky_sft, kind: sft, dataset: leaky, args: {STEPS}, n_samples: 1, max_new_tokens: 4}}
        """)
        )
    )
    runs = root / "runs"
    resources = {
        "store": ArtifactStore(runs_dir=str(runs)),
        "tracking": MLflowTracking(runs_dir=str(runs)),
        "training": TrainingResource(device="cpu"),
    }
    return materialize_pipeline(load(path), resources=resources, instance=DagsterInstance.ephemeral())


def test_a_leaking_split_blocks_training_unless_allowed(leaky_run):
    done = {s["asset"]: s["status"] for s in leaky_run["stages"]}
    assert done["leak/leaky"] == "SUCCESS" and done.get("leak/leaky_sft") != "SUCCESS", done
    assert "leak/leaky_sft" not in leaky_run["artifacts"] and "leaky_sft" not in leaky_run["artifacts"]
    assert done["leak/allowed_sft"] == "SUCCESS" and done["leak/report"] == "SUCCESS", done
    checks = [c for c in leaky_run["checks"] if c["name"] == "held_out_not_leaking"]
    assert sorted(c["passed"] for c in checks) == [False, False]  # both leak; only `allowed` lets training on
    manifest = json.loads((Path(leaky_run["artifacts"]["leaky"]) / "manifest.json").read_text())
    assert manifest["duplicates_dropped"] == 5 and manifest["train_rows"] + manifest["eval_rows"] == 30
    assert manifest["answer_overlap"] > 0 and "prompt_overlap" in manifest


def test_named_metrics_are_the_report_s_and_each_says_what_it_was_computed_on(leaky_run):
    art = {k: Path(v) for k, v in leaky_run["artifacts"].items()}
    report = json.loads((art["report"] / "report.json").read_text())
    assert set(report["merged"]["metrics"]) == {"exact", "token_f1"} and report["metrics_chosen_by"] == "pipeline"
    assert report["computed_on"]["metrics"].startswith(f"all {report['rows']} held-out rows")
    adapter = json.loads((art["allowed_sft"] / "metrics.json").read_text())
    assert adapter["computed_on"] == "n_samples=3 held-out rows"
    assert set(adapter["metrics"]) == {"exact", "contains", "token_f1", "length_ratio"}  # text answers: no numeric
