"""A LoRA layer's adapter product added into its base layer's output by the matrix product itself.

PEFT's LoRA forward is `base(x) + lora_B(lora_A(dropout(x))) * scaling`: after the three products it runs two
elementwise passes over the layer's whole output (the scaling, the addition), and backward one more (the
scaling again), each as large as the output. For SmolLM2's seven adapted projections a layer, those passes read
and write about 140 MB a layer at a step of 4 rows on a CPU. Here the last product accumulates into the base
output, `out.addmm_(lora_A(dropout(x)), lora_B.weight.T, alpha=scaling)` (BLAS's C += alpha A B), so the
scaling lands on the small (tokens x rank) factors in backward and nothing runs over the output but the
products. The values are PEFT's sum; the gradients reach the same parameters.

A call runs PEFT's own forward when this does not apply: adapters off or merged, another adapter variant (DoRA)
or a LoRA bias, per-row adapter names, adapters or a base weight in another dtype than the input, autocast.
"""

from __future__ import annotations

import types

import torch


def use_lora_products(model) -> int:
    """Run every plain PEFT LoRA linear layer of model with the accumulated product; returns how many."""
    from peft.tuners.lora.layer import Linear as LoraLinear

    changed = 0
    for module in model.modules():
        if type(module) is LoraLinear and "forward" not in module.__dict__:
            module.forward = types.MethodType(accumulated_forward, module)
            changed += 1
    return changed


def applies(layer, x: torch.Tensor, args: tuple, kwargs: dict) -> bool:
    """Whether this call can take the accumulated product (otherwise PEFT's forward runs it)."""
    if args or kwargs or layer.disable_adapters or layer.merged or torch.is_autocast_enabled(x.device.type):
        return False
    if getattr(layer.get_base_layer(), "weight", x).dtype != x.dtype:
        return False
    for name in layer.active_adapters:
        if name not in layer.lora_A:
            continue
        if name in layer.lora_variant or layer.lora_B[name].bias is not None:
            return False
        if layer.lora_A[name].weight.dtype != x.dtype or layer.lora_B[name].weight.dtype != x.dtype:
            return False
    return True


def accumulated_forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """PEFT's LoRA Linear forward with each adapter's last product accumulated into the base output."""
    if not applies(self, x, args, kwargs):
        return type(self).forward(self, x, *args, **kwargs)  # the class's: PEFT's own
    flat = x.reshape(-1, x.shape[-1])
    result = self.base_layer(flat).contiguous()  # a copy only where a patched base returned a view
    for name in self.active_adapters:
        if name not in self.lora_A:
            continue
        down = self.lora_A[name](self.lora_dropout[name](flat))
        # in place: the base product's backward keeps its inputs, not this output
        result = result.addmm_(down, self.lora_B[name].weight.t(), alpha=self.scaling[name])
    return result.view(*x.shape[:-1], result.shape[-1])
