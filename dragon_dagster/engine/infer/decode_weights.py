"""The weights a CPU decodes with: LoRA adapters folded in, every linear layer packed for few-row products.

Decoding multiplies a handful of rows (a GRPO group's eight completions) by every weight matrix of the model
once per token. On the benchmark CPU, torch's default product ran those at 6-10 GB/s of weights, a fraction of
the memory bandwidth: most of the time went into laying the weight out for the kernel, again at every call.
oneDNN's linear with a weight packed once (the layout torch.compile's CPU freezing uses) ran SmolLM2's
layers 2.4x faster and its 49,152-word output head 3.3x faster for eight rows.

For the duration of `prepared(model, rows)`:
- each LoRA layer's adapters are folded into a new weight W + scaling B A, the sum PEFT's merge makes, so a
  token costs one product per layer instead of three (the 210 adapters' small products, additions and
  scalings were a sixth of SmolLM2's decoding time); PEFT then runs the base layer alone, as for a merged
  adapter. The original W is never written: PEFT's own merge/unmerge would add and subtract in place and drift
  in the last bits over many rounds.
- with oneDNN, every linear layer runs on a packed copy of its weight (the folded one for a LoRA layer); the
  copies are freed when the context ends. Packing all of SmolLM2 takes about 0.1 s, a round of 32 tokens
  saves well over a second.
- the layers that take the same input one after the other (q/k/v, gate/up) run as one product on their
  weights stacked and packed together: 4 products a decoder layer instead of 7, which start and join torch's
  threads less often. On the benchmark CPU, all of SmolLM2's products for eight rows alone took 51 ms instead
  of 59 with two threads (best of 12, interleaved), 77 instead of 78 on one; within a whole sampling call
  the difference was inside the noise of a shared machine (benchmarks/limits.py --ab-fused measures it).
CPU only: on a GPU the copies would cost memory that a larger model needs, and its kernels need no packing.
"""

from __future__ import annotations

import contextlib
import functools

import torch


def foldable(model) -> list:
    """The LoRA layers that can be folded: all of them or none. Plain LoRA on float nn.Linear weights in CPU
    memory, adapters on and not merged; none with DoRA or another variant, a LoRA bias, or modules kept
    whole (modules_to_save), which a folded model would not run."""
    from peft.tuners.lora.layer import Linear as LoraLinear
    from peft.utils.other import ModulesToSaveWrapper

    layers = [m for m in model.modules() if hasattr(m, "lora_A")]
    if not layers or any(isinstance(m, ModulesToSaveWrapper) for m in model.modules()):
        return []
    for layer in layers:
        base = layer.get_base_layer()
        if (
            type(layer) is not LoraLinear
            or type(base) is not torch.nn.Linear
            or layer.disable_adapters
            or layer.merged
            or layer.lora_variant
            or layer.fan_in_fan_out
            or any(layer.lora_bias.values())
            or not on_cpu(base.weight)
        ):
            return []
    return layers


def on_cpu(weight: torch.Tensor) -> bool:
    return weight.device.type == "cpu" and weight.dtype.is_floating_point


def folded_weight(layer, out: torch.Tensor | None = None) -> tuple[torch.Tensor, list[str]]:
    """W + scaling B A over the layer's active adapters (PEFT's get_delta_weight, fused into one product), and
    the adapters it holds; written into out when given (a part of a stacked weight)."""
    merged = layer.get_base_layer().weight.detach()
    active = [name for name in layer.active_adapters if name in layer.lora_A]
    for i, name in enumerate(active):
        a, b = layer.lora_A[name].weight, layer.lora_B[name].weight
        if out is not None and i:
            merged = out.addmm_(b.to(merged.dtype), a.to(merged.dtype), alpha=layer.scaling[name])
        else:
            merged = torch.addmm(merged, b.to(merged.dtype), a.to(merged.dtype), alpha=layer.scaling[name], out=out)
    if out is not None and not active:
        merged = out.copy_(merged)
    return merged, active


def packable(rows: int) -> bool:
    """Whether oneDNN can pack weights here (a torch build with it, on a CPU that runs it)."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        probe = torch.ops.mkldnn._reorder_linear_weight(torch.ones(2, 2), rows)
        return torch.equal(packed_linear(probe, None, torch.ones(1, 2)), torch.full((1, 2), 2.0))
    except (RuntimeError, AttributeError, NotImplementedError):
        return False


def packed_linear(packed: torch.Tensor, bias: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    """nn.Linear's forward on a weight packed by torch.ops.mkldnn._reorder_linear_weight."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [None], "")


def plain_linears(model) -> list[torch.nn.Linear]:
    """The model's own linear layers, outside LoRA's adapter matrices and without a forward set on the instance
    (accelerate's hooks put one there); float32 weights in CPU memory."""
    adapters = {
        id(m)
        for layer in model.modules()
        if hasattr(layer, "lora_A")
        for m in list(layer.lora_A.values()) + list(layer.lora_B.values())
    }
    return [
        m
        for m in model.modules()
        if type(m) is torch.nn.Linear
        and id(m) not in adapters
        and "forward" not in m.__dict__
        and on_cpu(m.weight)
        and m.weight.dtype == torch.float32
    ]


# Linear layers that a decoder layer runs on the same input one after the other: packed as one weight, their
# outputs stacked, they take one product per token instead of two or three.
FUSED = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def fused_groups(model, linears: list[torch.nn.Linear]) -> list[list[torch.nn.Linear]]:
    """The groups of FUSED among `linears` (LoRA layers by their base layer): the same input width, all with a
    bias or all without."""
    packing = {id(m) for m in linears}
    groups = []
    for module in model.modules():
        for names in FUSED:
            members = [getattr(module, name, None) for name in names]
            members = [m.get_base_layer() if hasattr(m, "get_base_layer") else m for m in members]
            if (
                all(isinstance(m, torch.nn.Linear) and id(m) in packing for m in members)
                and len({m.in_features for m in members}) == 1
                and len({m.bias is None for m in members}) == 1
            ):
                groups.append(members)
    return groups


class Fused:
    """One packed product for a group of linear layers that take the same input: the first layer's call runs it
    and keeps the others' outputs for their calls on that same tensor; a call on any other input runs the
    product again and keeps only its own part."""

    def __init__(self, packed: torch.Tensor, bias: torch.Tensor | None, sizes: list[int]):
        self.packed, self.bias, self.sizes = packed, bias, sizes
        self.kept = None  # (the input, {index: that layer's output}), replaced whole: read once a call

    def forward(self, index: int, x: torch.Tensor) -> torch.Tensor:
        kept = self.kept
        if kept is not None and kept[0] is x and index in kept[1]:
            out = kept[1].pop(index)
            if not kept[1]:
                self.kept = None  # the last part taken: no reference kept past the layer
            return out
        parts = [part.contiguous() for part in self.stacked(x).split(self.sizes, dim=-1)]
        self.kept = (x, {i: part for i, part in enumerate(parts) if i != index})
        return parts[index]

    def stacked(self, x: torch.Tensor) -> torch.Tensor:
        """Every layer's output side by side (the decoding loop splits it into views, copying nothing)."""
        return packed_linear(self.packed, self.bias, x)


class FusedPart:
    """One layer's forward inside a Fused group: which group, and its place in it (the decoding loop reads both)."""

    def __init__(self, fused: Fused, index: int):
        self.fused, self.index = fused, index

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.fused.forward(self.index, x)


@contextlib.contextmanager
def prepared(model, rows: int):
    """model decodes `rows` rows at a time on folded, packed weights (see the module's docstring) for the
    duration; afterwards it is as it was. A model with nothing to fold or pack runs unchanged. For inference
    only: the packed products carry no gradient."""
    folds = foldable(model) if not model.training else []  # train mode: LoRA's dropout still acts
    swapped, patched = [], []
    linears = plain_linears(model) if packable(rows) else []
    try:
        with torch.no_grad():
            groups = fused_groups(model, linears)
            stacks, parts = [], {}  # a group's weights stacked in one buffer, each layer's rows of it
            for group in groups:
                stacked = torch.empty(
                    sum(m.out_features for m in group), group[0].in_features, dtype=group[0].weight.dtype
                )
                stacks.append(stacked)
                parts.update(zip(map(id, group), stacked.split([m.out_features for m in group]), strict=True))
            weights = {}
            for layer in folds:  # PEFT now runs the base layer alone
                base = layer.get_base_layer()
                weights[id(base)], layer.merged_adapters = folded_weight(layer, parts.get(id(base)))
            for group in groups:
                stacked = stacks.pop(0)  # freed once packed
                for m in group:
                    if weights.pop(id(m), None) is None:  # not folded: its own weight
                        parts[id(m)].copy_(m.weight)
                bias = torch.cat([m.bias.detach() for m in group]) if group[0].bias is not None else None
                fused = Fused(
                    torch.ops.mkldnn._reorder_linear_weight(stacked, rows), bias, [m.out_features for m in group]
                )
                for index, module in enumerate(group):
                    module.forward = FusedPart(fused, index)
                    patched.append(module)
            stacked = None
            parts.clear()
            for module in linears:
                if "forward" in module.__dict__:  # fused above
                    continue
                weight = weights.pop(id(module), module.weight)
                module.forward = functools.partial(
                    packed_linear,
                    torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), rows),
                    module.bias,
                )
                patched.append(module)
            for layer in folds:  # not packed: the base layer runs on the folded weight itself
                base = layer.get_base_layer()
                if id(base) in weights:
                    swapped.append((base.weight, base.weight.data))
                    base.weight.data = weights.pop(id(base))
        yield
    finally:
        for module in patched:
            del module.forward
        for weight, original in swapped:
            weight.data = original
        for layer in folds:
            layer.merged_adapters = []
