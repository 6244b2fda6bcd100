"""The fast paths with LoRA dropout on: what stays the same, and what does not.

The kernel tests (test_lm_head.py, test_unpadded.py, test_preference_head.py, ...) compare every fast path with
dropout 0. With dropout on, two paths draw their masks differently, so a bare comparison of one draw with another
says nothing. Here the masks are arranged:

- the fast dropout given the very masks torch's dropout drew gives torch's loss and gradients exactly, and its
  own masks give the same expected loss and gradient (a test whose tolerance comes from the spread of the
  draws, and which a dropout without the 1 / (1 - p) scale fails);
- the unpadded forward, with each token's mask fixed by its (row, column) in the padded batch, gives the padded
  values and gradients;
- rows that share a prompt (DPO's chosen and rejected, a GRPO group) run that prompt once unpadded, so they share
  ONE dropout draw over it where TRL's padded batch draws one per row: documented, not equal.
"""

from __future__ import annotations

import math

import pytest
import torch

from dragon_dagster.engine.train import dropout as fast_dropout
from dragon_dagster.engine.train import lm_head, unpadded
from tests.engine.train.fast_paths import assert_same_grads, collate, dpo_batch, examples, lora_grads, ragged_batch
from tests.support import small_lora_model

P = 0.125  # a multiple of 2^-16: the fast mask's rate and scale are then exactly torch's (1 / 0.875)


def lora_dropouts(model) -> list[tuple[str, torch.nn.Module]]:
    """(name, module) of every LoRA dropout, in the order the forward calls them."""
    return [
        (name, module.lora_dropout["default"])
        for name, module in model.named_modules()
        if isinstance(getattr(module, "lora_dropout", None), torch.nn.ModuleDict)
    ]


def sft_loss(model, batch) -> torch.Tensor:
    """The chunked head's SFT loss (the trainer's compute_loss) on a padded batch."""
    loss, _ = lm_head.causal_lm_loss(model, batch, batch["labels"])
    return loss


# ------------------------------------------------------------------------- fast masks against torch's masks


def test_fast_dropout_given_torchs_masks_gives_torchs_loss_and_gradients(monkeypatch):
    model = small_lora_model(dropout=P)
    batch = collate(examples(), padding_free=False)
    drawn = []

    def record(module, inputs, output):
        assert (inputs[0] != 0).all()  # so output == 0 is exactly where the mask dropped
        drawn.append(output != 0)

    hooks = [m.register_forward_hook(record) for _, m in lora_dropouts(model)]
    assert len(hooks) == 14 and all(type(m) is torch.nn.Dropout for _, m in lora_dropouts(model))
    torch.manual_seed(0)
    loss = sft_loss(model, batch)
    loss.backward()
    expected = lora_grads(model)
    for hook in hooks:
        hook.remove()
    assert len(drawn) == 14 and all((~keep).any() for keep in drawn)
    with torch.no_grad():
        model.eval()
        no_dropout = sft_loss(model, batch)
        model.train()
    assert abs(no_dropout.item() - loss.item()) > 1e-4  # the masks matter to the loss

    # the same masks handed to FastDropout, in the order the forward asks for them; its own scale
    assert fast_dropout.use_fast_dropout(model) == 14
    masks, real_keep_mask = list(drawn), fast_dropout.keep_mask

    def torchs_mask(shape, p, device=None):
        keep = masks.pop(0)
        assert keep.shape == shape and p == P
        return keep, real_keep_mask(shape, p, device)[1]

    monkeypatch.setattr(fast_dropout, "keep_mask", torchs_mask)
    monkeypatch.setattr(fast_dropout, "SMALL", 0)  # the test's tensors are small: take the fast path anyway
    fast = sft_loss(model, batch)
    fast.backward()
    assert not masks  # every mask used, each by the module torch drew it for
    assert fast.item() == pytest.approx(loss.item(), rel=1e-6)
    assert_same_grads(lora_grads(model), expected, tol=1e-6)


def mean_and_error(values: list[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)


def same_expectation(a: list[float], b: list[float], sigmas: float = 4.0) -> tuple[bool, float, float]:
    """Whether two samples' means agree within sigmas standard errors of their difference."""
    (mean_a, se_a), (mean_b, se_b) = mean_and_error(a), mean_and_error(b)
    bound = sigmas * math.sqrt(se_a**2 + se_b**2)
    return abs(mean_a - mean_b) <= bound, abs(mean_a - mean_b), bound


def test_fast_dropout_masks_give_torchs_expected_loss_and_gradient(monkeypatch):
    """Over many seeds the fast masks (16-bit draws) and torch's (one 32-bit draw per element) estimate the same
    expected loss and gradient of a LoRA layer. The tolerance is 4 standard errors of the difference of the two
    means, from the draws' own spread; a dropout that forgets the 1 / (1 - p) scale fails the same criterion.

    One adapted layer with a squared-error loss, not the whole model: the loss is then quadratic in the mask, so
    its expectation checks the mask's first two moments (rate and scale), and the spread is small enough for 200
    draws to tell a wrong scale (measured: the unscaled control sits ~55 standard errors away in the loss, ~10 in
    the gradient)."""
    draws = 200
    model = small_lora_model(dropout=0.1)  # not a multiple of 2^-16: the fast rate is 0.1000061
    layer = model.get_base_model().model.layers[0].mlp.down_proj  # 64 -> 32, LoRA rank 4
    g = torch.Generator().manual_seed(11)
    x, target = torch.randn(4, 32, 64, generator=g), torch.randn(4, 32, 32, generator=g)
    trained = {n: p for n, p in layer.named_parameters() if p.requires_grad}
    direction = {n: torch.randn(p.shape, generator=g) for n, p in trained.items()}

    def sample(seed0: int) -> tuple[list[float], list[float]]:
        """Per draw: the loss, and its gradient projected on a fixed direction (a scalar summary of it)."""
        losses, projections = [], []
        for seed in range(seed0, seed0 + draws):
            torch.manual_seed(seed)
            loss = ((layer(x) - target) ** 2).mean()
            loss.backward()
            projections.append(sum(float((p.grad * direction[n]).sum()) for n, p in trained.items()))
            layer.zero_grad()
            losses.append(loss.item())
        return losses, projections

    monkeypatch.setattr(fast_dropout, "SMALL", 0)  # 8,192 elements: take the fast path anyway
    torch_losses, torch_projections = sample(0)
    assert fast_dropout.use_fast_dropout(model) == 14
    assert isinstance(layer.lora_dropout["default"], fast_dropout.FastDropout)
    fast_losses, fast_projections = sample(10_000)  # other seeds: independent draws
    for name, a, b in (("loss", torch_losses, fast_losses), ("gradient", torch_projections, fast_projections)):
        ok, diff, bound = same_expectation(a, b)
        assert ok, f"{name}: the means differ by {diff:.3g}, more than 4 standard errors ({bound:.3g})"
        assert mean_and_error(a)[1] > 0  # the draws vary: the test compares distributions, not one value

    # the control: masks at the right rate without the rescaling shift the expectation past the same bound
    real_keep_mask = fast_dropout.keep_mask
    monkeypatch.setattr(fast_dropout, "keep_mask", lambda shape, p, device=None: (real_keep_mask(shape, p)[0], 1.0))
    unscaled_losses, unscaled_projections = sample(20_000)
    assert not same_expectation(torch_losses, unscaled_losses)[0]
    assert not same_expectation(torch_projections, unscaled_projections)[0]


# ------------------------------------------------------------------- unpadded against padded, masks arranged


class PositionKeyedDropout(torch.nn.Module):
    """LoRA dropout whose mask is fixed per (row, column, feature) of the padded batch: a token is dropped alike
    in the padded batch and in the unpadded row (found there through the layout the unpadded forward used)."""

    def __init__(self, keep: torch.Tensor, p: float, layouts: list):
        super().__init__()
        self.keep, self.p, self.layouts = keep, p, layouts

    def forward(self, x):
        if x.shape[:2] == self.keep.shape[:2]:  # the padded batch
            keep = self.keep
        else:  # the unpadded row: each flat token takes the mask of the padded position it came from
            rows, cols = flat_sources(self.layouts[-1].index)
            assert x.shape[:2] == (1, len(rows)), x.shape
            keep = self.keep[rows, cols][None]
        return x * keep.to(x.dtype) / (1 - self.p)


def flat_sources(index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For each token of the unpadded row, the (row, column) of the padded batch it was laid down from: the first
    such position (a shared prompt is laid down from the first row that has it)."""
    order = torch.arange(index.numel())
    flat, valid = index.flatten(), index.flatten() >= 0
    first = torch.full((int(flat.max()) + 1,), index.numel()).scatter_reduce(0, flat[valid], order[valid], "amin")
    return first // index.shape[1], first % index.shape[1]


def keyed_dropout(model, shape: tuple[int, int], monkeypatch, seed=0) -> tuple[dict, list]:
    """Put a PositionKeyedDropout (rate P) in front of every LoRA adapter of model; returns the masks by module
    name and the list the unpadded forward's layouts are recorded into."""
    layouts = []
    real_layout = unpadded.layout

    def recorded(*args, **kwargs):
        layouts.append(real_layout(*args, **kwargs))
        return layouts[-1]

    monkeypatch.setattr(unpadded, "layout", recorded)
    g = torch.Generator().manual_seed(seed)
    masks = {}
    for name, module in model.named_modules():
        if isinstance(getattr(module, "lora_dropout", None), torch.nn.ModuleDict):
            masks[name] = torch.rand(*shape, module.in_features, generator=g) >= P
            module.lora_dropout["default"] = PositionKeyedDropout(masks[name], P, layouts)
    assert len(masks) == 14
    return masks, layouts


def test_unpadded_forward_with_dropout_gives_the_padded_values_when_each_token_keeps_its_mask(monkeypatch):
    model = small_lora_model()
    ids, mask = ragged_batch()
    n, weights = 6, torch.randn(4, 6, generator=torch.Generator().manual_seed(1))
    logps, _ = lm_head.completion_logprobs(model, ids, mask, n, 0.7)  # no dropout: the control
    model.zero_grad()
    keyed_dropout(model, ids.shape, monkeypatch)
    padded, entropy = lm_head.completion_logprobs(model, ids, mask, n, 0.7, chunk=4)
    (padded * weights).sum().backward()
    expected = lora_grads(model)
    assert not torch.allclose(padded, logps, atol=1e-3)  # the masks move the values
    unpadded.use(model)
    fast, fast_entropy = lm_head.completion_logprobs(model, ids, mask, n, 0.7, chunk=4, unpad=True)
    assert torch.allclose(fast, padded, atol=1e-5) and torch.allclose(fast_entropy, entropy, atol=1e-4)
    (fast * weights).sum().backward()
    assert_same_grads(lora_grads(model), expected)


def test_unpadded_sft_loss_with_dropout_gives_the_padded_loss_when_each_token_keeps_its_mask(monkeypatch):
    model = small_lora_model()
    batch = collate(examples(), padding_free=False)
    keyed_dropout(model, batch["input_ids"].shape, monkeypatch)
    padded, counts = lm_head.causal_lm_loss(model, batch, batch["labels"])
    padded.backward()
    expected = lora_grads(model)
    unpadded.use(model)
    fast, fast_counts = lm_head.causal_lm_loss(model, batch, batch["labels"], unpad=True)
    assert fast.item() == pytest.approx(padded.item(), rel=1e-5) and fast_counts == counts
    fast.backward()
    assert_same_grads(lora_grads(model), expected)


def tie_shared_prompts(masks: dict, index: torch.Tensor) -> set[tuple[int, int]]:
    """Give every padded position the unpadded forward laid down from another row that row's mask (what running a
    shared prompt once amounts to); returns those positions."""
    rows, cols = flat_sources(index)
    tied = set()
    for r, c in (index >= 0).nonzero().tolist():
        src = int(rows[index[r, c]]), int(cols[index[r, c]])
        if src != (r, c):
            tied.add((r, c))
            for keep in masks.values():
                keep[r, c] = keep[src]
    return tied


def test_dpo_pairs_share_one_dropout_draw_over_their_prompt_where_trl_draws_one_per_row(monkeypatch):
    """Unpadded, a DPO pair's common prompt runs once: its chosen and rejected replies see the same dropout mask
    over the prompt. TRL's padded batch drops the two rows' prompts independently. The fast path equals the padded
    batch exactly when the rejected row's prompt is given the chosen row's masks, and not with masks of its own."""
    from trl.trainer.utils import add_fused_lm_head

    from dragon_dagster.engine.train.preference_head import use_chunked_head

    model = small_lora_model()
    ids, mask, labels = dpo_batch()  # pairs (0, 3) and (1, 4) share their prompt; pair (2, 5) does not
    masks, layouts = keyed_dropout(model, ids.shape, monkeypatch)
    causal_lm = model.get_base_model()
    add_fused_lm_head(causal_lm, outputs=("log_probs",))
    trl_forward = causal_lm.forward
    weights = torch.randn(ids.shape[0], ids.shape[1] - 1, generator=torch.Generator().manual_seed(2))

    def run():
        out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
        (out.log_probs * weights).sum().backward()
        return out.log_probs.detach(), lora_grads(model)

    trl_own, trl_own_grads = run()  # TRL's semantics: each row's prompt has a mask of its own
    unpadded.use(model)
    use_chunked_head(causal_lm, unpad=True, paired=True)
    fast, fast_grads = run()
    tied = tie_shared_prompts(masks, layouts[-1].index)
    assert tied == {(3, c) for c in range(5)} | {(4, c) for c in range(3)}  # the rejected rows' prompts
    alone = [0, 1, 2, 5]  # rows whose prompt masks are their own either way
    assert torch.allclose(fast[alone], trl_own[alone], atol=1e-5)
    differs = (fast[[3, 4]] - trl_own[[3, 4]]).abs().amax(dim=1)
    assert (differs > 1e-3).all(), differs  # the rejected replies: other prompt masks, other values
    assert any(not torch.allclose(fast_grads[k], trl_own_grads[k], atol=1e-4) for k in fast_grads)

    # the padded batch with the chosen row's prompt masks copied onto the rejected row's gives the fast path's values
    causal_lm.forward = trl_forward  # TRL's padded forward again (the unpadded attention falls through to SDPA)
    shared, shared_grads = run()
    assert torch.allclose(fast, shared, atol=1e-5)
    assert_same_grads(fast_grads, shared_grads)


def test_a_grpo_group_shares_one_dropout_draw_over_its_prompt_where_trl_draws_one_per_row(monkeypatch):
    """As for DPO: unpadded, a GRPO group's completions score against one run of their prompt, one dropout draw;
    TRL's padded batch draws one per completion."""
    model = small_lora_model()
    g = torch.Generator().manual_seed(7)
    n = 5
    prompts = [torch.randint(0, 300, (k,), generator=g) for k in (6, 4)]  # two prompts, three completions each
    ids = torch.zeros(6, 6 + n, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row in range(6):
        prompt = prompts[row // 3]
        ids[row, 6 - len(prompt) : 6] = prompt
        ids[row, 6:] = torch.randint(0, 300, (n,), generator=g)
        mask[row, 6 - len(prompt) :] = 1
    weights = torch.randn(6, n, generator=g)
    masks, layouts = keyed_dropout(model, ids.shape, monkeypatch)

    def run(unpad: bool):
        logps, _ = lm_head.completion_logprobs(model, ids, mask, n, 0.9, unpad=unpad)
        (logps * weights).sum().backward()
        return logps.detach(), lora_grads(model)

    trl_own, _ = run(unpad=False)  # each completion's row drops its own copy of the prompt
    unpadded.use(model)
    fast, fast_grads = run(unpad=True)
    tied = tie_shared_prompts(masks, layouts[-1].index)
    assert tied == {(r, c) for r in (1, 2) for c in range(6)} | {(r, c) for r in (4, 5) for c in range(2, 6)}
    assert torch.allclose(fast[[0, 3]], trl_own[[0, 3]], atol=1e-5)  # each group's first row: its own masks
    assert ((fast[[1, 2, 4, 5]] - trl_own[[1, 2, 4, 5]]).abs().amax(dim=1) > 1e-3).all()
    shared, shared_grads = run(unpad=False)  # padded, the group's first row's prompt masks on every row
    assert torch.allclose(fast, shared, atol=1e-5)
    assert_same_grads(fast_grads, shared_grads)
