"""Packing (padding-free rows): sequences packed into one row do not attend to each other, so the loss is
the padded one; an SFT run with packing on trains and says so."""

import pytest
import torch

from dragon_dagster.engine.config.reporter import Reporter
from dragon_dagster.engine.stages.sft.worker import train_sft
from dragon_dagster.engine.train import lm_head
from tests.engine.train.fast_paths import assert_same_grads, collate, examples, lora_grads
from tests.support import sft_job as job
from tests.support import small_lora_model, ticket_files


def test_packed_rows_give_the_padded_loss_because_sequences_do_not_attend_to_each_other():
    model = small_lora_model()
    rows = examples()
    padded, packed = collate(rows, padding_free=False), collate(rows, padding_free=True)
    assert packed["input_ids"].shape[0] == 1 and "attention_mask" not in packed  # one row, no padding
    plain = model(**padded).loss
    plain.backward()
    expected = lora_grads(model)
    fast, _ = lm_head.causal_lm_loss(model, packed, packed["labels"])
    assert fast.item() == pytest.approx(plain.item(), rel=1e-5)
    fast.backward()
    assert_same_grads(lora_grads(model), expected)
    # the control: one long sequence (positions running on) lets later rows see earlier ones, and the loss moves
    leaky = {"input_ids": packed["input_ids"], "position_ids": torch.arange(packed["input_ids"].shape[1])[None]}
    wrong, _ = lm_head.causal_lm_loss(model, leaky, packed["labels"])
    assert abs(wrong.item() - plain.item()) > 1e-3


def test_sft_packing_trains_and_says_so(tiny_model, tmp_path):
    train, held = ticket_files(tmp_path, n=40)
    run = job(tmp_path, tiny_model, train, held, {"packing": "on"}, max_steps=2)

    class Lines(Reporter):
        def __init__(self):
            super().__init__()
            self.lines = []

        def log(self, message):
            self.lines.append(message)

    reporter = Lines()
    result = train_sft(run, reporter)
    assert result.global_step == 2 and (tmp_path / "out" / "adapter" / "adapter_config.json").exists()
    assert any("packing on" in line for line in reporter.lines)
