"""Accumulated LoRA products (train/lora_products.py): each adapter's product added into its layer's output,
PEFT's values and gradients."""

import torch

from tests.engine.train.fast_paths import assert_same_grads, lora_grads
from tests.support import small_lora_model


def test_lora_layers_accumulate_their_product_into_the_base_output_with_peft_values_and_gradients():
    from torch.profiler import profile

    from dragon_dagster.engine.train.dropout import use_fast_dropout
    from dragon_dagster.engine.train.lora_products import use_lora_products

    model = small_lora_model(kind="qwen2", dropout=0.1)  # q/k/v with biases, LoRA dropout drawn in the adapters
    use_fast_dropout(model)
    ids = torch.randint(0, 300, (3, 7), generator=torch.Generator().manual_seed(2))

    def run():
        torch.manual_seed(3)  # the same dropout masks on both paths
        logits = model(input_ids=ids).logits
        (logits * torch.linspace(-1, 1, logits.shape[-1])).sum().backward()
        return logits.detach(), lora_grads(model)

    peft_logits, peft_grads = run()
    with torch.no_grad(), model.disable_adapter():
        base_logits = model(input_ids=ids).logits
    assert use_lora_products(model) == 14  # seven adapted projections per layer
    with profile() as prof:
        logits, grads = run()
    ops = {e.key: e.count for e in prof.key_averages()}
    assert ops.get("aten::addmm_") == 14  # each adapter's product accumulated into its layer's output
    assert torch.allclose(logits, peft_logits, atol=1e-5)
    assert_same_grads(grads, peft_grads)
    with torch.no_grad(), model.disable_adapter():  # adapters off: the base layers alone, as PEFT runs them
        assert torch.equal(model(input_ids=ids).logits, base_logits)
    assert use_lora_products(model) == 0  # once per layer
