"""Synthesized data: teacher and judge through a real `transformers serve` and a scripted server on loopback."""

import json
import re

import pytest

from dragon_dagster.engine.artifacts.manifest import AdapterManifest, write_manifest
from dragon_dagster.engine.config.hardware import Hardware
from dragon_dagster.engine.config.job import SynthesisInputs
from dragon_dagster.engine.config.reporter import Reporter
from dragon_dagster.engine.config.results import TrainingSummary
from dragon_dagster.engine.data import errors, row_mapping, row_parts, tables
from dragon_dagster.engine.infer.local_backend import LocalBackend
from dragon_dagster.engine.stages.preference_pairs.settings import PreferencePairs
from dragon_dagster.engine.stages.preference_pairs.worker import PairsJob, synthesize_pairs
from dragon_dagster.engine.stages.synthetic_dataset.settings import SyntheticDataset
from dragon_dagster.engine.stages.synthetic_dataset.worker import SyntheticJob, quality_pass, synthesize_sft
from tests.support import completion


def pairs_settings(**settings) -> PreferencePairs:
    return PreferencePairs(name="preference_pairs", kind="preference_pairs", dataset="prompts", **settings)


def synthetic(**settings) -> SyntheticDataset:
    return SyntheticDataset(name="synthetic", kind="synthetic_dataset", dataset="prompts", **settings)


def chat_rows(n=6):
    return [
        {
            "prompt": [{"role": "user", "content": f"Question number {i}: how do I reset device {i}?"}],
            "completion": [{"role": "assistant", "content": f"Hold the button on device {i} for ten seconds."}],
        }
        for i in range(n)
    ]


def adapter_artifact(tmp_path, model):
    """A minimal adapter artifact over `model`: a zero-step LoRA, so the student is the model itself."""
    from peft import LoraConfig, get_peft_model

    from dragon_dagster.engine import models

    directory = tmp_path / "student"
    peft_model = get_peft_model(
        models.load_model(str(model), models.Hardware(device="cpu")),
        LoraConfig(r=2, target_modules="all-linear", task_type="CAUSAL_LM"),
    )
    peft_model.save_pretrained(directory / "adapter")
    write_manifest(
        directory,
        AdapterManifest[TrainingSummary](
            stage="student",
            method="sft",
            base_model=str(model),
            resolved_model=str(model),
            chain=[str(directory / "adapter")],
            dataset=str(tmp_path / "dataset"),
            settings={},
            result=TrainingSummary(objective="sft"),
        ),
    )
    return [str(directory / "adapter")]


def test_teacher_through_transformers_serve_writes_sft_rows(served, tmp_path):
    tables.write_jsonl(tmp_path / "prompts.jsonl", chat_rows(6))
    (tmp_path / "out").mkdir()
    teacher = {"type": "server", "base_url": served["url"], "model": served["model"], "timeout": 60}
    settings = synthetic(teacher=teacher, max_new_tokens=6, temperature=0.0, dedupe=False)
    result = synthesize_sft(
        SyntheticJob(
            settings=settings,
            inputs=SynthesisInputs(prompts_file=str(tmp_path / "prompts.jsonl")),
            output_dir=str(tmp_path / "out"),
        ),
        Reporter(),
    )
    rows = tables.read_jsonl(tmp_path / "out" / "train.jsonl") + tables.read_jsonl(tmp_path / "out" / "eval.jsonl")
    assert result.kept == len(rows) == 6 - sum(result.dropped.values())
    local = LocalBackend(served["model"], device="cpu", batch_size=1).chat(
        [r["prompt"] for r in chat_rows(6)], max_new_tokens=6
    )
    assert sorted(row_parts.reply_text(r) for r in rows) == sorted(r for r in local if r)  # the server's answers


def test_a_judge_that_never_returns_json_drops_every_prompt_with_a_count(served, chatty_model, tmp_path):
    tables.write_jsonl(tmp_path / "prompts.jsonl", chat_rows(3))
    (tmp_path / "out").mkdir()
    settings = pairs_settings(
        mode="judge",
        judge={"type": "server", "base_url": served["url"], "model": served["model"]},
        n_samples_per_prompt=2,
        max_new_tokens=4,
    )
    job = PairsJob(
        settings=settings,
        inputs=SynthesisInputs(
            model=str(chatty_model),
            adapters=adapter_artifact(tmp_path, chatty_model),
            prompts_file=str(tmp_path / "prompts.jsonl"),
        ),
        output_dir=str(tmp_path / "out"),
        hardware=Hardware(device="cpu"),
    )
    with pytest.raises(ValueError, match=r"no preference pairs were kept.*judge_unparsed': 3"):
        synthesize_pairs(job, Reporter())


def test_judge_mode_keeps_best_and_worst_and_drops_small_gaps(stub, chatty_model, tmp_path):
    def by_length(n, body):  # a deterministic judge: longer replies score higher, capped at 10
        reply = re.search(r"<assistant_reply>\n(.*?)\n</assistant_reply>", body["messages"][-1]["content"], re.S)
        return 200, completion(json.dumps({"score": min(10, 1 + len(reply.group(1))), "reason": "length"}))

    judge = stub(by_length)
    tables.write_jsonl(tmp_path / "prompts.jsonl", chat_rows(4))
    (tmp_path / "out").mkdir()
    settings = pairs_settings(
        mode="judge",
        judge={"type": "server", "base_url": judge.url, "model": "judge"},
        n_samples_per_prompt=4,
        min_gap=0,
        temperature=1.5,
        max_new_tokens=6,
    )
    job = PairsJob(
        settings=settings,
        inputs=SynthesisInputs(
            model=str(chatty_model),
            adapters=adapter_artifact(tmp_path, chatty_model),
            prompts_file=str(tmp_path / "prompts.jsonl"),
        ),
        output_dir=str(tmp_path / "out"),
        hardware=Hardware(device="cpu"),
    )
    result = synthesize_pairs(job, Reporter())
    pairs = tables.read_jsonl(tmp_path / "out" / "pairs.jsonl")
    assert result.kept == len(pairs) and result.kept + sum(result.dropped.values()) == 4
    for pair in pairs:
        assert pair["chosen_score"] == min(10, 1 + len(pair["chosen"][0]["content"]))
        assert pair["chosen_score"] >= pair["rejected_score"]
        assert pair["chosen"][0]["content"] != pair["rejected"][0]["content"]
    job.settings.min_gap, job.output_dir = 11, str(tmp_path / "out2")  # no gap can reach 11 on a 1-10 scale
    (tmp_path / "out2").mkdir()
    with pytest.raises(ValueError, match="gap_under_min_gap|identical_samples"):
        synthesize_pairs(job, Reporter())


def test_teacher_mode_with_the_reference_reply(chatty_model, tmp_path):
    rows = chat_rows(4)
    rows[1]["completion"][0]["content"] = ""  # an empty reference is dropped, not trained on
    tables.write_jsonl(tmp_path / "prompts.jsonl", rows)
    (tmp_path / "out").mkdir()
    job = PairsJob(
        settings=pairs_settings(max_new_tokens=4),
        inputs=SynthesisInputs(
            model=str(chatty_model),
            adapters=adapter_artifact(tmp_path, chatty_model),
            prompts_file=str(tmp_path / "prompts.jsonl"),
        ),
        output_dir=str(tmp_path / "out"),
        hardware=Hardware(device="cpu"),
    )
    result = synthesize_pairs(job, Reporter())
    pairs = tables.read_jsonl(tmp_path / "out" / "pairs.jsonl")
    assert result.dropped == {"empty_reply": 1} and len(pairs) == 3
    references = {row_parts.user_text(r): row_parts.reply_text(r) for r in rows}
    assert all(p["chosen"][0]["content"] == references[row_parts.user_text(p)] for p in pairs)


def test_quality_pass_counts_each_reason():
    def row(prompt, reply):
        return {
            "prompt": [{"role": "user", "content": prompt}],
            "completion": [{"role": "assistant", "content": reply}],
        }

    rows = [
        row("a", "A fine answer about routers."),
        row("b", "x"),
        row("c", "%%%% #### 1234 !!!!"),
        row("a", "Another answer entirely."),
        row("d", "A fine answer about routers."),
        row("e", "A fine answer about routers!"),
        row("f", "y" * 500),
        row("g", "Something new and useful."),
    ]
    job = SyntheticJob(
        settings=synthetic(teacher="-", min_chars=3, max_chars=400, min_alpha_ratio=0.5),
        inputs=SynthesisInputs(prompts_file="-"),
        output_dir="-",
    )
    kept, dropped = quality_pass(rows, job)
    assert [row_parts.user_text(r) for r in kept] == ["a", "g"]
    assert dropped == {
        "too_short": 1,
        "garbled": 1,
        "repeated_prompt": 1,
        "repeated_response": 1,
        "near_repeated_response": 1,
        "too_long": 1,
    }


def test_pairs_with_equal_replies_are_counted_and_missing_columns_named():
    import pandas as pd

    df = pd.DataFrame({"q": ["2+2?", "Capital?", "Hi"], "good": ["4", "Paris", "Hello"], "bad": ["5", "Paris", "Yo"]})
    rows, dropped = row_mapping.map_pairs(df, row_mapping.PairsMapping(prompt="q", chosen="good", rejected="bad"))
    assert len(rows) == 2 and dropped["chosen_equals_rejected"] == 1
    with pytest.raises(errors.DataError, match=r"rejected.*\['q', 'good', 'bad'\]"):
        row_mapping.map_pairs(df, row_mapping.PairsMapping(prompt="q", chosen="good", rejected="worse"))
    with pytest.raises(errors.DataError, match="every row was dropped"):
        row_mapping.map_pairs(
            df.assign(bad=df["good"]), row_mapping.PairsMapping(prompt="q", chosen="good", rejected="bad")
        )


def test_pairs_are_held_out_from_the_source_held_out_rows_never_from_rows_trained_on(chatty_model, tmp_path):
    """A reference pair's chosen reply is the SFT target of its prompt: pairs held out from the SFT dataset's
    training rows would score what the SFT stage trained on. With the source's held-out rows given, the held-out
    pairs are made from them and the training pairs from the training rows only."""
    trained, held = chat_rows(30), chat_rows(40)[30:]
    tables.write_jsonl(tmp_path / "train.jsonl", trained)
    tables.write_jsonl(tmp_path / "eval.jsonl", held)
    (tmp_path / "out").mkdir()
    job = PairsJob(
        settings=pairs_settings(n=24, eval_frac=0.25, max_new_tokens=3, temperature=1.0),
        inputs=SynthesisInputs(
            model=str(chatty_model),
            adapters=adapter_artifact(tmp_path, chatty_model),
            prompts_file=str(tmp_path / "train.jsonl"),
            held_out_file=str(tmp_path / "eval.jsonl"),
        ),
        output_dir=str(tmp_path / "out"),
        hardware=Hardware(device="cpu"),
    )
    result = synthesize_pairs(job, Reporter())
    prompts = {
        side: [row_parts.user_text(p) for p in tables.read_jsonl(tmp_path / "out" / f"{side}.jsonl")]
        for side in ("train", "eval")
    }
    held_prompts = {row_parts.user_text(r) for r in held}
    trained_prompts = {row_parts.user_text(r) for r in trained}
    assert result.eval_rows == len(prompts["eval"]) == 6 - result.dropped.get("chosen_equals_rejected", 0)
    assert prompts["eval"] and set(prompts["eval"]) <= held_prompts
    assert set(prompts["train"]) <= trained_prompts and len(prompts["train"]) + len(prompts["eval"]) == result.kept
    assert not any("_held_out" in p for p in tables.read_jsonl(tmp_path / "out" / "pairs.jsonl"))

    # without the source's held-out rows the pairs are split as before (what an older artifact's job gives)
    (tmp_path / "out2").mkdir()
    job = job.model_copy(
        update={"inputs": job.inputs.model_copy(update={"held_out_file": None}), "output_dir": str(tmp_path / "out2")}
    )
    result = synthesize_pairs(job, Reporter())
    assert {row_parts.user_text(p) for p in tables.read_jsonl(tmp_path / "out2" / "eval.jsonl")} <= trained_prompts
