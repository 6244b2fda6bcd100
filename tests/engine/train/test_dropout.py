"""Fast dropout (train/dropout.py): the rate asked, the expectation kept, swapped into LoRA's adapters."""

import pytest
import torch


def test_fast_dropout_drops_at_the_rate_asked_keeps_the_expectation_and_swaps_into_lora():
    from dragon_dagster.engine.train.dropout import FastDropout, keep_mask, use_fast_dropout

    torch.manual_seed(0)
    keep, scale = keep_mask((1000, 1000), 0.05)
    assert keep.float().mean().item() == pytest.approx(0.95, abs=0.001)  # 1e6 draws: sd 0.0002
    assert scale == pytest.approx(1 / 0.95, rel=1e-4)
    lanes = keep.view(-1, 4).float().mean(dim=0)  # each 16-bit quarter of a 64-bit draw drops alike
    assert torch.allclose(lanes, torch.full((4,), 0.95), atol=0.002)
    x = torch.ones(500, 1000, requires_grad=True)
    dropout = FastDropout(0.1).train()
    y = dropout(x)
    assert y.mean().item() == pytest.approx(1.0, abs=0.01)
    assert y.unique().tolist() == [0.0, pytest.approx(1 / 0.9, rel=1e-4)]
    y.sum().backward()
    assert torch.equal(x.grad, y.detach())  # backward scales by the same mask
    assert torch.equal(dropout.eval()(x), x)
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=50,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    model = get_peft_model(LlamaForCausalLM(config), LoraConfig(r=2, target_modules="all-linear", lora_dropout=0.05))
    assert use_fast_dropout(model) == 14  # seven adapted projections per layer
    assert sum(isinstance(m, FastDropout) and m.p == 0.05 for m in model.modules()) == 14
