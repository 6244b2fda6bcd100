"""Whole training runs through the project's workers: the fast paths train what TRL's own paths train.

The kernel tests (test_lm_head.py, test_unpadded.py, test_preference_head.py, ...) compare one batch's values
and gradients. Here each preference kind's worker (train_dpo, train_orpo, train_kto, as the runtime's worker calls
them on a job) trains the tiny model for several optimizer steps with the chunked head and again with TRL's, and
the logged losses and the saved LoRA weights must agree; and SFT with packing must train on exactly the rows'
tokens, with no row attending to another in its pack.
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
from dragon_dagster.engine.data import row_mapping, tables
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
    rows = row_mapping.map_rows(
        tables.read_table(EXAMPLE_DIR / "tickets.csv"),
        row_mapping.Mapping(prompt="{subject}\n\n{body}", response="reply"),
    )[:16]
    pairs = [
        {"prompt": r["prompt"], "chosen": r["completion"], "rejected": [{"role": "assistant", "content": "Wait."}]}
        for r in rows
    ]
    path = tmp_path_factory.mktemp("pairs") / "pairs.jsonl"
    tables.write_jsonl(path, pairs)
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
def test_preference_kinds_with_the_chunked_head_train_like_trls_head(
    kind, tiny_model, pairs_file, tmp_path, monkeypatch
):
    from dragon_dagster.engine.train import preference_head

    trl_rows, trl_weights = train_preference_kind(kind, "trl", tiny_model, pairs_file, tmp_path / "trl")
    continued = []  # KTO's mismatched replies, scored from the rated pass's prompts (stages/kto/trainer.py)
    score = preference_head.score_continuations
    monkeypatch.setattr(preference_head, "score_continuations", lambda *a: continued.append(1) or score(*a))
    ours_rows, our_weights = train_preference_kind(kind, "chunked", tiny_model, pairs_file, tmp_path / "chunked")
    assert len(continued) == (STEPS if kind == "kto" else 0)
    if kind == "kto":  # the KL term moves off zero as the policy moves, and is TRL's at every step
        assert trl_rows[-1]["kl"] > 0.1
        assert [r["kl"] for r in ours_rows] == pytest.approx([r["kl"] for r in trl_rows], rel=1e-4, abs=1e-6)
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


PACK = 256  # max_seq_len: two of the tickets' rows (about 120 tokens each) fit in one pack


def sft_batches(tmp_path: Path, tiny_model, packing: str, monkeypatch) -> tuple[list[dict], list]:
    """One epoch of SFT through train_sft (chunked head, LoRA dropout 0); each micro-batch the loss was computed
    on, and for the packed run the per-row losses inside the first pack of several rows and of each row alone."""
    from dragon_dagster.engine.stages.sft.trainer import chunked_loss_trainer
    from dragon_dagster.engine.stages.sft.worker import train_sft
    from dragon_dagster.engine.train import lm_head
    from tests.support import sft_job, ticket_files

    tmp_path.mkdir()
    train, held = ticket_files(tmp_path, n=12)
    job = sft_job(
        tmp_path,
        tiny_model,
        train,
        held,
        {"packing": packing},
        max_steps=None,
        epochs=1,
        batch_size=2,
        max_seq_len=PACK,
    )
    job.settings.lora.dropout = 0.0
    trainer_class = chunked_loss_trainer()
    real_compute_loss = trainer_class.compute_loss
    batches, pairs = [], []

    def recorded(self, model, inputs, *args, **kwargs):
        batches.append({k: v.clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)})
        if packing == "on" and not pairs and len(segments(inputs)) > 1:
            pairs.extend(losses_in_pack_and_alone(model, inputs, lm_head))
        return real_compute_loss(self, model, inputs, *args, **kwargs)

    with monkeypatch.context() as patched:  # undone after the run: the next run wraps the real method again
        patched.setattr(trainer_class, "compute_loss", recorded)
        result = train_sft(job, Reporter())
    assert result.speed["loss_kernel"] == "chunked" and result.speed["packing"] == packing
    return batches, pairs


def segments(batch: dict) -> list[tuple[int, int]]:
    """(start, end) of each sequence in a packed row: position ids restart at 0 where a sequence starts."""
    starts = (batch["position_ids"][0] == 0).nonzero().flatten().tolist()
    return list(zip(starts, starts[1:] + [batch["position_ids"].shape[1]]))


def losses_in_pack_and_alone(model, batch: dict, lm_head) -> list[tuple[float, float]]:
    """For each sequence of a packed batch: (its loss inside the pack, the other rows' labels masked; its loss run
    as a batch of its own), in eval mode and without gradient, through the trainer's loss (lm_head)."""
    pairs = []
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for start, end in segments(batch):
            only = torch.full_like(batch["labels"], -100)
            only[:, start:end] = batch["labels"][:, start:end]
            in_pack, _ = lm_head.causal_lm_loss(model, batch, only)
            ids = batch["input_ids"][:, start:end]
            alone = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
            by_itself, _ = lm_head.causal_lm_loss(model, alone, batch["labels"][:, start:end])
            pairs.append((in_pack.item(), by_itself.item()))
    model.train(was_training)
    return pairs


def test_sft_packing_trains_every_reply_token_once_and_no_row_attends_to_another(tiny_model, tmp_path, monkeypatch):
    padded, _ = sft_batches(tmp_path / "padded", tiny_model, "off", monkeypatch)
    packed, pairs = sft_batches(tmp_path / "packed", tiny_model, "on", monkeypatch)

    def rows_of_padded(batch):
        keep = batch["attention_mask"].bool()
        return [
            (tuple(batch["input_ids"][r][keep[r]].tolist()), tuple(batch["labels"][r][keep[r]].tolist()))
            for r in range(keep.shape[0])
        ]

    expected = sorted(row for batch in padded for row in rows_of_padded(batch))
    seen = []
    for batch in packed:
        assert batch["input_ids"].shape[0] == 1 and "attention_mask" not in batch  # one row, no padding
        spans = segments(batch)
        assert spans[0][0] == 0 and spans[-1][1] == batch["input_ids"].shape[1]  # every position is some row's
        assert batch["input_ids"].shape[1] <= 2 * PACK  # two packs of max_seq_len at most per micro-batch
        in_step = [
            (tuple(batch["input_ids"][0, a:b].tolist()), tuple(batch["labels"][0, a:b].tolist())) for a, b in spans
        ]
        # the tokens trained in this step: exactly the reply tokens of the rows packed into it
        assert int((batch["labels"] != -100).sum()) == sum(sum(t != -100 for t in labels) for _, labels in in_step)
        seen.extend(in_step)
    assert len(packed) < len(padded)  # packing made fewer, fuller steps
    # over the epoch: every row once, token for token, labels included (a row's first token is its prompt's)
    assert sorted(seen) == expected and len(expected) == len({ids for ids, _ in expected})
    assert sum(sum(t != -100 for t in labels) for _, labels in seen) > 0
    # inside a pack each row scores as it does alone: no row attends to the others
    assert len(pairs) > 1
    for in_pack, alone in pairs:
        assert in_pack == pytest.approx(alone, rel=1e-5)
