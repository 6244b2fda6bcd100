"""Personal data through Dagster (issue 63): a dataset stage with `pii: block` stops the stage after it with the
rows named, one with `pii: redact` writes its rows with placeholders, and `feedback.pii: block` stops a
retraining at the feedback dataset. Nothing trains: the blocked stages never start."""

import json
import textwrap
from pathlib import Path

import pandas as pd
from dagster import AssetCheckSeverity, AssetSelection, DagsterInstance, materialize

from dragon_dagster.assets.automation import PIPELINE_TAG, RANGE_TAG
from dragon_dagster.assets.factory import build_pipeline_defs
from dragon_dagster.assets.launch import materialize_pipeline
from dragon_dagster.engine.data.feedback.sqlite import SQLiteFeedbackStore
from dragon_dagster.engine.pipeline import load
from tests.support import component_yaml

STEPS = "{max_steps: 1, batch_size: 2, grad_accum: 1, max_seq_len: 64}"
EMAIL, CARD = "jane.doe@example.com", "4111 1111 1111 1111"


def pipeline_with_pii(root: Path, model) -> Path:
    rows = [{"question": f"Why does hub {i} blink?", "answer": f"Restart hub {i}."} for i in range(24)]
    rows[3]["question"] = f"Hub 3 blinks; write to {EMAIL}"
    rows[7]["answer"] = f"Refund sent to card {CARD}."
    pd.DataFrame(rows).to_csv(root / "hubs.csv", index=False)
    path = root / "defs" / "pii" / "defs.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(
        component_yaml(
            textwrap.dedent(f"""\
        name: pii
        model: {model}
        datasets: {{hubs: {{path: "{root / "hubs.csv"}"}}}}
        stages:
          - {{name: redacted, kind: chat_dataset, source: hubs, prompt: question, response: answer, pii: redact}}
          - {{name: blocked, kind: chat_dataset, source: hubs, prompt: question, response: answer, pii: block}}
          - {{name: blocked_sft, kind: sft, dataset: blocked, args: {STEPS}, n_samples: 0}}
          - {{name: merged, kind: merge}}  # what retraining from feedback continues from
        feedback:
          pii: block
          objectives: [sft]
          sft: {{args: {STEPS}, n_samples: 0}}
          evaluate: {{skills: []}}
        """)
        )
    )
    return path


def test_block_stops_the_next_stage_naming_the_rows_and_redact_keeps_them(tiny_model, tmp_path):
    from dragon_dagster.resources import ArtifactStore, MLflowTracking, TrainingResource

    pipeline = load(pipeline_with_pii(tmp_path, tiny_model))
    runs = tmp_path / "runs"
    resources = {
        "store": ArtifactStore(runs_dir=str(runs)),
        "tracking": MLflowTracking(runs_dir=str(runs)),
        "training": TrainingResource(device="cpu"),
    }
    outcome = materialize_pipeline(pipeline, resources=resources, instance=DagsterInstance.ephemeral())
    done = {s["asset"]: s["status"] for s in outcome["stages"]}
    assert done["pii/blocked"] == "SUCCESS" and done.get("pii/blocked_sft") != "SUCCESS", done
    assert "blocked_sft" not in outcome["artifacts"]
    checks = {(c["asset"], c["name"]): c for c in outcome["checks"] if c["name"] == "no_personal_data"}
    blocked, redacted = checks[("pii/blocked", "no_personal_data")], checks[("pii/redacted", "no_personal_data")]
    assert not blocked["passed"] and redacted["passed"], checks
    why = blocked["description"]
    assert "personal data in 2 of 24 rows (1 CREDIT_CARD, 1 EMAIL_ADDRESS)" in why, why
    assert "row 3 (prompt): EMAIL_ADDRESS" in why and "row 7 (completion): CREDIT_CARD" in why
    assert "pii: redact" in why and EMAIL not in why and CARD not in why

    art = Path(outcome["artifacts"]["redacted"])
    rows = [json.loads(line) for f in ("train.jsonl", "eval.jsonl") for line in (art / f).read_text().splitlines()]
    texts = json.dumps(rows)
    assert len(rows) == 24 and EMAIL not in texts and CARD not in texts
    assert "Hub 3 blinks; write to <EMAIL_ADDRESS>" in texts and "Refund sent to card <CREDIT_CARD>." in texts
    manifest = json.loads((art / "manifest.json").read_text())
    assert manifest["pii"]["counts"] == {"CREDIT_CARD": 1, "EMAIL_ADDRESS": 1} and manifest["pii"]["redacted"] == 2
    assert "PERSON" in manifest["pii"]["not_detected"]


def test_feedback_pii_block_stops_the_retraining_at_its_dataset(tiny_model, tmp_path):
    from dragon_dagster.resources import ArtifactStore, MLflowTracking, TrainingResource

    pipeline = load(pipeline_with_pii(tmp_path, tiny_model))
    store_resource = ArtifactStore(runs_dir=str(tmp_path / "runs"))
    resources = {
        "store": store_resource,
        "tracking": MLflowTracking(runs_dir=str(tmp_path / "runs")),
        "training": TrainingResource(device="cpu"),
    }
    store = SQLiteFeedbackStore(store_resource.feedback_path("pii"))
    store.record("a", [{"role": "user", "content": f"I am {EMAIL}, my hub blinks"}], "Restart it.", "up")
    store.record("b", [{"role": "user", "content": "The lock jams"}], "Oil the bolt.", "up")
    store.record("c", [{"role": "user", "content": "The bell is silent"}], "Change the battery.", "up")
    parts = build_pipeline_defs(pipeline)
    result = materialize(
        parts["assets"] + parts["asset_checks"],
        instance=DagsterInstance.ephemeral(),
        resources=resources,
        selection=AssetSelection.assets(["pii", "feedback_sft_dataset"], ["pii", "sft_on_feedback"]),
        raise_on_error=False,
        tags={RANGE_TAG: "1-3", PIPELINE_TAG: "pii"},
    )
    [check] = [e for e in result.get_asset_check_evaluations() if e.check_name == "no_personal_data"]
    assert not check.passed and check.severity == AssetCheckSeverity.ERROR
    assert "record 1 (turns): EMAIL_ADDRESS" in check.description and "feedback.pii: redact" in check.description
    assert EMAIL not in check.description
    made = {e.asset_key.path[-1] for e in result.get_asset_materialization_events()}
    assert made == {"feedback_sft_dataset"}, "the retraining stops at its dataset"
