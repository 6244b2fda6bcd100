"""What the fast-path tests share: TRL-shaped rows and batches (padded every way a trainer pads), a LoRA
model's gradients compared name by name, and a short GRPO run's logged rows on either loss kernel."""

import json
from pathlib import Path

import torch

from dragon_dagster.engine import catalog
from dragon_dagster.engine.config.hardware import Hardware, Speed
from dragon_dagster.engine.config.job import TrainingInputs
from dragon_dagster.engine.config.reporter import Reporter
from dragon_dagster.engine.stages.grpo.settings import GRPO


def examples(vocab=300, lengths=(9, 14, 6, 11), prompt=4, seed=1):
    """Prompt-completion rows as TRL's dataset preparation leaves them: labels are -100 on the prompt."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for n in lengths:
        ids = torch.randint(0, vocab, (n,), generator=g).tolist()
        rows.append({"input_ids": ids, "labels": [-100] * prompt + ids[prompt:]})
    return rows


def collate(rows, padding_free: bool):
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    return DataCollatorForLanguageModeling(pad_token_id=0, padding_free=padding_free)(rows)


def lora_grads(model) -> dict:
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    model.zero_grad()
    return grads


def assert_same_grads(a: dict, b: dict, tol=1e-5):
    assert a.keys() == b.keys() and a
    for name in a:
        assert torch.allclose(a[name], b[name], atol=tol, rtol=1e-4), name


def ragged_batch(vocab=300, rows=4, length=12, seed=3):
    """Token ids and a mask padded every way a trainer pads: left (a prompt), right (an early end), both."""
    ids = torch.randint(0, vocab, (rows, length), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    mask[2, -2:] = 0
    mask[3, :2] = 0
    mask[3, -1] = 0
    return ids, mask


def dpo_batch(vocab=300, seed=5):
    """DPO's [chosen; rejected] rows, right-padded: pairs 0 and 1 share their prompt, pair 2's prompts differ."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, vocab, (n,), generator=g) for n in (5, 3, 4)]
    other = torch.randint(0, vocab, (4,), generator=g)
    replies = [torch.randint(0, vocab, (n,), generator=g) for n in (4, 6, 3, 2, 5, 3)]
    rows = [torch.cat([prompts[i], replies[i]]) for i in range(3)]
    rows += [torch.cat([prompts[0], replies[3]]), torch.cat([prompts[1], replies[4]]), torch.cat([other, replies[5]])]
    starts = [5, 3, 4, 5, 3, 4]
    length = max(len(r) for r in rows)
    ids = torch.zeros(6, length, dtype=torch.long)
    mask = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for i, row in enumerate(rows):
        ids[i, : len(row)], mask[i, : len(row)] = row, 1
        labels[i, starts[i] : len(row)] = row[starts[i] :]
    return ids, mask, labels


def progress_rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "progress.jsonl").read_text().splitlines()]


def grpo_rows_logged(tmp_path, tiny_model, kernel: str) -> list[dict]:
    from dragon_dagster.engine.data import row_mapping, tables
    from dragon_dagster.engine.pipeline.definition import EXAMPLE_DIR
    from dragon_dagster.engine.stages.grpo.worker import train_grpo

    work = tmp_path / kernel
    (work / "out").mkdir(parents=True)
    prompts = row_mapping.map_prompts(
        tables.read_table(EXAMPLE_DIR / "arithmetic.csv"),
        row_mapping.PromptsMapping(prompt="question", reference="answer"),
    )[:16]
    tables.write_jsonl(work / "prompts.jsonl", prompts)
    settings = GRPO(
        name="grpo_adapter",
        kind="grpo",
        dataset="prompts",
        args={
            "max_steps": 2,
            "batch_size": 2,
            "grad_accum": 1,
            "logging_steps": 1,
            "save_steps": 100,
            "learning_rate": 5e-2,
            "warmup_ratio": 0.0,
        },
        rewards=[{"type": "length", "max_chars": 24}],
        group_size=8,
        beta=0.04,
        temperature=0.7,
        max_new_tokens=6,
        max_eval_prompts=2,
        n_samples=1,
        lora={"dropout": 0.0},
    )
    run = catalog.get("grpo").job_model()(
        settings=settings,
        inputs=TrainingInputs(
            model=str(tiny_model), train_file=str(work / "prompts.jsonl"), checkpoint_dir=str(work / "ckpt")
        ),
        output_dir=str(work / "out"),
        hardware=Hardware(device="cpu"),
        # one sampling round for both steps: step 2 weighs the same samples against step 1's update
        speed=Speed(loss_kernel=kernel, generation_batch_size=32),
    )
    result = train_grpo(run, Reporter())
    assert result.speed["loss_kernel"] == kernel and result.speed["generation_batch_size"] == 32
    assert result.speed["unpad"] == (kernel == "chunked")
    return [r for r in progress_rows(work / "out") if r.get("grad_norm") is not None]
