"""The trainer knobs passed through to transformers, shown by their effect on a real (tiny) training run.

The optimizer, its schedule and gradient clipping: the trainer's optimizer is the one named, a constant schedule
keeps the learning rate, and one update moves the LoRA weights by at most learning rate times max_grad_norm (SGD
without momentum: the update is the clipped gradient times the rate).

NEFTune through the sft worker: with neftune_noise_alpha the embeddings the training forward sees carry noise of
the paper's scale (alpha / sqrt(sequence length * hidden size) at most), without it they are the embedding table's
rows; and the noise is gone once training ends (the samples and the saved adapter see the plain model)."""

from __future__ import annotations

import math

import pytest
import torch

from dragon_dagster.engine.config.reporter import Reporter


def embedding_noise(tmp_path, tiny_model, monkeypatch, alpha: float | None) -> tuple[float, float, float]:
    """One SFT step through train_sft; the largest |embedded - table row| of the first batch's input embeddings
    in the training forward, the same after training (the module in train mode again), and NEFTune's bound."""
    from dragon_dagster.engine.stages.sft.trainer import chunked_loss_trainer
    from dragon_dagster.engine.stages.sft.worker import train_sft
    from tests.support import sft_job, ticket_files

    tmp_path.mkdir()
    train, held = ticket_files(tmp_path, n=4)
    job = sft_job(tmp_path, tiny_model, train, held, max_steps=1, save_steps=10)
    job = job.model_copy(update={"settings": job.settings.model_copy(update={"neftune_noise_alpha": alpha})})
    seen: dict = {}
    trainer_class = chunked_loss_trainer()
    real_compute_loss = trainer_class.compute_loss

    def deviation(embeddings, ids) -> float:
        with torch.no_grad():  # through the module: NEFTune's hook acts there, when the trainer set one
            return (embeddings(ids) - torch.nn.functional.embedding(ids, embeddings.weight)).abs().max().item()

    def measured(self, model, inputs, *args, **kwargs):
        if not seen and model.training:
            embeddings, ids = model.get_input_embeddings(), inputs["input_ids"]
            seen.update(embeddings=embeddings, ids=ids, during=deviation(embeddings, ids))
            seen["bound"] = (alpha or 0.0) / math.sqrt(ids.shape[1] * embeddings.weight.shape[1])
        return real_compute_loss(self, model, inputs, *args, **kwargs)

    with monkeypatch.context() as patched:
        patched.setattr(trainer_class, "compute_loss", measured)
        train_sft(job, Reporter())
    seen["embeddings"].train()
    return seen["during"], deviation(seen["embeddings"], seen["ids"]), seen["bound"]


@pytest.mark.timeout(180)
def test_neftune_noises_the_embeddings_while_training_only(tiny_model, tmp_path, monkeypatch):
    during, after, _ = embedding_noise(tmp_path / "plain", tiny_model, monkeypatch, None)
    assert during == after == 0.0
    during, after, bound = embedding_noise(tmp_path / "noisy", tiny_model, monkeypatch, 5.0)
    assert 0.2 * bound < during <= bound * (1 + 1e-4)  # uniform noise in [-bound, bound]: its largest is near it
    assert after == 0.0  # the trainer took its hook off when training ended


@pytest.mark.timeout(180)
def test_the_optimizer_schedule_and_clipping_act_on_the_run(tiny_model, tmp_path, monkeypatch):
    from dragon_dagster.engine.artifacts import progress
    from dragon_dagster.engine.stages.sft.trainer import chunked_loss_trainer
    from dragon_dagster.engine.stages.sft.worker import train_sft
    from tests.support import sft_job, ticket_files

    train, held = ticket_files(tmp_path, n=4)
    rate, clip = 0.5, 1e-3
    job = sft_job(
        tmp_path,
        tiny_model,
        train,
        held,
        max_steps=3,
        save_steps=10,
        learning_rate=rate,
        optim="sgd",
        lr_scheduler_type="constant",
        max_grad_norm=clip,
        warmup_ratio=0.0,
    )
    trainable: list[torch.Tensor] = []  # the LoRA weights at the start of each step
    optimizers = []
    trainer_class = chunked_loss_trainer()
    real_compute_loss = trainer_class.compute_loss

    def recorded(self, model, inputs, *args, **kwargs):
        if model.training:
            trainable.append(torch.cat([p.detach().flatten().clone() for p in model.parameters() if p.requires_grad]))
            optimizers.append(self.optimizer)
        return real_compute_loss(self, model, inputs, *args, **kwargs)

    with monkeypatch.context() as patched:
        patched.setattr(trainer_class, "compute_loss", recorded)
        train_sft(job, Reporter())
    assert type(optimizers[0].optimizer if hasattr(optimizers[0], "optimizer") else optimizers[0]) is torch.optim.SGD
    assert [row["lr"] for row in progress.read(tmp_path / "out") if row.get("lr") is not None] == [rate] * 3
    moves = [(after - before).norm().item() for before, after in zip(trainable, trainable[1:])]
    assert moves and all(0 < move <= rate * clip * (1 + 1e-3) for move in moves), moves
    grad_norms = [row["grad_norm"] for row in progress.read(tmp_path / "out") if row.get("grad_norm")]
    assert min(grad_norms) > 100 * clip  # the gradients were far above the limit: the clip is what held the moves
