"""KTO on rated replies (a thumbs up or down without a matching opposite): the rated_dataset kind, the kto
kind end to end through Dagster on the tiny model, and bad rated input."""

import json
import math
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
from dagster import DagsterInstance

from dragon_dagster.assets.launch import materialize_pipeline
from dragon_dagster.engine.artifacts.manifest import AdapterManifest, DatasetManifest, read_manifest
from dragon_dagster.engine.config.hardware import Hardware
from dragon_dagster.engine.data.errors import DataError
from dragon_dagster.engine.data.row_mapping import RatedMapping, map_rated, parse_label, unpaired
from dragon_dagster.engine.pipeline import PipelineError, load, parse
from dragon_dagster.engine.pipeline.definition import EXAMPLE_DIR
from dragon_dagster.engine.stages.kto.result import KTOResult
from dragon_dagster.engine.stages.sft.result import SFTResult

STEPS = "{max_steps: 4, batch_size: 4, grad_accum: 1, logging_steps: 1, max_seq_len: 128, learning_rate: 1.0e-3}"
BAD_REPLY = "I cannot help with that."


def rated_csv(path: Path, n: int = 40) -> Path:
    """Tickets rated the way people rate in a chat: the real reply liked, a useless one disliked, unpaired
    (each ticket gets one or the other)."""
    tickets = pd.read_csv(EXAMPLE_DIR / "tickets.csv").head(n)
    liked = [i % 3 != 0 for i in range(n)]
    pd.DataFrame(
        {
            "subject": tickets["subject"],
            "answer": [r if ok else BAD_REPLY for r, ok in zip(tickets["reply"], liked)],
            "rating": ["up" if ok else "down" for ok in liked],
        }
    ).to_csv(path, index=False)
    return path


def kto_yaml(directory: Path, model: Path, label: str = "rating", kind: str = "kto") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    rated_csv(directory / "rated.csv")
    path = directory / "kto.yaml"
    path.write_text(
        textwrap.dedent(f"""\
        name: kto
        model: {model}
        stages:
          - {{name: sft_dataset, kind: chat_dataset, path: "example:tickets.csv", prompt: "{{subject}}",
              response: reply}}
          - {{name: sft_adapter, kind: sft, dataset: sft_dataset, args: {STEPS}, n_samples: 1, max_new_tokens: 4}}
          - {{name: ratings, kind: rated_dataset, path: rated.csv, prompt: "{{subject}}", reply: answer,
              label: {label}, eval_frac: 0.2}}
          - {{name: kto_adapter, kind: {kind}, dataset: ratings, args: {STEPS}, n_samples: 2, max_new_tokens: 4}}
          - {{name: merged_model, kind: merge}}
        """)
    )
    return path


def test_labels_read_from_the_usual_spellings_and_a_bad_one_is_named():
    assert [parse_label(v) for v in (True, 1, 0.0, "up", "Down", "liked", "1.0", "no")] == [
        True,
        True,
        False,
        True,
        False,
        True,
        True,
        False,
    ]
    df = pd.DataFrame({"q": ["a", "b"], "r": ["x", "y"], "ok": ["up", "maybe"]})
    with pytest.raises(DataError, match=r"row 2, column 'ok': label 'maybe' is neither liked"):
        map_rated(df, RatedMapping("q", "r", "ok"))
    with pytest.raises(DataError, match=r"label mapping 'verdict' names missing column\(s\) \['verdict'\]"):
        map_rated(df, RatedMapping("q", "r", "verdict"))


def test_rated_rows_keep_their_source_positions_and_numeric_labels():
    df = pd.DataFrame({"q": ["a", "", "c", "d"], "r": ["x", "y", "z", "w"], "ok": [1.0, -1.0, -1.0, 0.0]})
    kept = []
    rows, dropped = map_rated(df, RatedMapping("q", "r", "ok"), kept)
    assert kept == [0, 2, 3] and dropped == {"empty": 1}, "group_by values follow the rows kept"
    assert [r["label"] for r in rows] == [True, False, False]
    assert [parse_label(v) for v in ("-1.0", "+1", -1, "-1")] == [False, True, False, False]


def test_a_preference_kind_refuses_the_other_kind_of_rows():
    from dragon_dagster.engine.stages.dpo.settings import DPO
    from dragon_dagster.engine.stages.kto.settings import KTO
    from dragon_dagster.engine.stages.kto.worker import KTOMethod
    from dragon_dagster.engine.train.preference import check_rows
    from dragon_dagster.engine.train.trainer import TrainingError
    from dragon_dagster.engine.train.trl_config import TrainerRun

    rated = [{"prompt": [], "completion": [], "label": True}]
    dpo = DPO(name="s", kind="dpo", dataset="d")
    kto = KTO(name="s", kind="kto", dataset="d")
    with pytest.raises(TrainingError, match="dpo trains on pairs .* or a kind that trains on rated replies"):
        check_rows(dpo, rated)  # a dpo stage handed rated replies at run time
    with pytest.raises(TrainingError, match="kto needs at least 2 rows per device step.*this run has 1"):
        # batch_size 2 split over 2 workers: refused before the trainer is built
        job = SimpleNamespace(settings=KTO(name="s", kind="kto", dataset="d", args={"batch_size": 2}))
        run = TrainerRun(Hardware(device="cpu"), "unused", workers=2)
        KTOMethod().trainer(job, None, run, None, chunked=False)
    check_rows(kto, rated)


def test_pairs_unpair_into_a_liked_and_a_disliked_reply():
    pair = {
        "prompt": [{"role": "user", "content": "q"}],
        "chosen": [{"role": "assistant", "content": "good"}],
        "rejected": [{"role": "assistant", "content": "bad"}],
    }
    rated = {"prompt": pair["prompt"], "completion": pair["rejected"], "label": False}
    assert unpaired([pair, rated]) == [
        {"prompt": pair["prompt"], "completion": pair["chosen"], "label": True},
        {"prompt": pair["prompt"], "completion": pair["rejected"], "label": False},
        rated,
    ]


def test_kinds_need_their_kind_of_data(tiny_model, tmp_path):
    with pytest.raises(PipelineError, match=r"kto_adapter.*\(dpo\) trains on pairs.*rated_dataset.*kind: kto"):
        load(kto_yaml(tmp_path / "dpo", tiny_model, kind="dpo"))
    stages = [
        {"name": "d", "kind": "chat_dataset", "path": "x.csv", "prompt": "p", "response": "r"},
        {"name": "s", "kind": "sft", "dataset": "d"},
        {"name": "k", "kind": "kto", "dataset": "d"},
    ]
    with pytest.raises(PipelineError, match=r"\(kto\) trains on rated replies.*: its dataset 'd' is a chat_dataset"):
        parse({"name": "p", "stages": stages})
    stages[2].update(dataset="tickets")
    with pytest.raises(PipelineError, match=r"names 'tickets', a source file: map it with a rated_dataset or"):
        parse({"name": "p", "datasets": {"tickets": {"path": "t.csv"}}, "stages": stages})
    stages[2].update(dataset="d", args={"batch_size": 1})
    with pytest.raises(PipelineError, match="KTO needs batch_size >= 2"):
        parse({"name": "p", "stages": stages})


@pytest.fixture(scope="module")
def kto_run(tiny_model, tmp_path_factory):
    from dragon_dagster.resources import ArtifactStore, MLflowTracking, TrainingResource

    root = tmp_path_factory.mktemp("kto")
    runs = root / "runs"
    resources = {
        "store": ArtifactStore(runs_dir=str(runs)),
        "tracking": MLflowTracking(runs_dir=str(runs)),
        "training": TrainingResource(device="cpu"),
    }
    outcome = materialize_pipeline(
        load(kto_yaml(root / "p", tiny_model)), resources=resources, instance=DagsterInstance.ephemeral()
    )
    return {"outcome": outcome, "tracking": resources["tracking"]}


def test_kto_stage_trains_on_rated_replies_end_to_end(kto_run):
    from mlflow import MlflowClient

    outcome = kto_run["outcome"]
    assert outcome["success"], [s for s in outcome["stages"] if s["status"] != "SUCCESS"]
    art = {k: Path(v) for k, v in outcome["artifacts"].items()}
    data = [json.loads(line) for line in (art["ratings"] / "train.jsonl").read_text().splitlines()]
    held = [json.loads(line) for line in (art["ratings"] / "eval.jsonl").read_text().splitlines()]
    assert (
        len(data) + len(held) + read_manifest(art["ratings"], DatasetManifest).duplicates_dropped == 40
        and held
        and {r["label"] for r in data} == {True, False}
    )
    assert all(r["completion"][0]["content"] == BAD_REPLY for r in data if not r["label"])

    manifest = read_manifest(art["kto_adapter"], AdapterManifest[KTOResult])
    sft = read_manifest(art["sft_adapter"], AdapterManifest[SFTResult])
    assert manifest.method == "kto" and manifest.chain == sft.chain + [str(art["kto_adapter"] / "adapter")]
    result = manifest.result
    liked = sum(r["label"] for r in data)
    assert (result.train_liked, result.train_disliked) == (liked, len(data) - liked)
    # fewer disliked replies: the liked ones weigh less, so both sides pull about equally
    assert result.desirable_weight == pytest.approx((len(data) - liked) / liked) and result.undesirable_weight == 1
    assert result.eval_rows == len(held) and result.eval_liked + result.eval_disliked == len(held)
    assert 0.0 <= result.pref_accuracy <= 1.0 and result.reward_margin is not None
    assert (art["kto_adapter"] / "adapter" / "adapter_config.json").exists()
    samples = [json.loads(line) for line in (art["kto_adapter"] / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 2 and {"reply", "label", "generated"} <= set(samples[0])

    run = MlflowClient(kto_run["tracking"].uri).get_run(manifest.mlflow_run_id)
    assert run.data.tags["method"] == "kto" and run.data.params["method"] == "kto"
    assert {"train/kl", "train/rewards/chosen", "eval/pref_accuracy", "eval/kto_loss"} <= set(run.data.metrics)
    losses = [json.loads(line).get("loss") for line in (art["kto_adapter"] / "progress.jsonl").read_text().splitlines()]
    assert len([x for x in losses if x is not None]) == 4 and all(math.isfinite(x) for x in losses if x is not None)
    assert "losses_finite_and_falling" in {c["name"] for c in outcome["checks"] if c["asset"] == "kto/kto_adapter"}
