"""Sampling GRPO's completions: each group's prompt prefilled once, no LoRA dropout, one draw per token.

TRL's GRPO (without vLLM) calls model.generate on rows that repeat every prompt group_size times, with the
model in train mode. On the benchmark CPU these parts of that cost more than they give:

- the prompt's forward pass runs group_size times over the same tokens. Here it runs once per group, and its
  KV cache is repeated for the group's rows; the rows then decode as before. Greedy decoding gives the same
  tokens (tests/engine/train/test_rollout.py).
- in train mode every LoRA adapter draws a dropout mask for every sampled token: one torch call per adapter
  per token, 210 calls a token for SmolLM2, a fifth of the decoding time for eight rows. Here the model samples
  in eval mode, as TRL's vLLM path does: the completions come from the policy itself, not from the policy
  under a random dropout mask. Training passes keep their dropout.
- torch.multinomial draws an exponential variate for every word of the 49,152-word vocabulary at every step
  (9 ms for eight rows). Inverse-CDF sampling draws one uniform number per row and finds it in the running
  sum of the probabilities (in float64, so a word's share is kept to 1e-16): for each token, the distribution
  torch.multinomial draws from, at 2.4 ms. MPS has no float64: there the sum is float32 (running_dtype), whose
  word boundaries are off by up to about 1e-7 of the total over SmolLM2's 49,152 words (measured on a CPU in
  float32; no MPS device has run it), so a word rarer than that is drawn at the wrong rate, possibly never.
- on a CPU each LoRA adapter is folded into its layer's weight and every linear layer runs on a oneDNN copy of
  its weight packed for few-row products (decode_weights.py): decoding eight rows took 2.4x less time per layer.
- Llama-family models decode in this project's own loop (infer/decode_loop.py, generate's custom_generate: a
  preallocated KV cache, the layers run straight on the packed products; a decoding step 15% shorter than in
  generate's loop on the benchmark CPU), which prefills each group's prompt once itself; other models keep
  generate's loop on a cache prefilled here.
- the log-probability of each sampled token is kept: when a sampling round serves several steps, these are
  the old policy's log-probabilities that GRPO's probability ratio divides by, which TRL would otherwise
  recompute with one more forward pass over every completion (in train mode, under a dropout mask).
"""

from __future__ import annotations

import contextlib
import functools

import torch

from ..infer import decode_loop, decode_weights
from ..infer.decode_loop import groups_of


def running_dtype(device_type: str) -> torch.dtype:
    """The running sum's dtype on a device: float64, except on MPS, which has no float64 (float32 there: word
    boundaries within about 1e-7 of the total, see the module's notes)."""
    return torch.float32 if device_type == "mps" else torch.float64


def inverse_cdf(
    probs: torch.Tensor,
    num_samples: int = 1,
    replacement: bool = False,
    *,
    generator=None,
    out=None,
    record: list | None = None,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """torch.multinomial for one sample per row of a 2-D probs: index i with probability probs[i] / sum(probs).

    record, when given, gets each draw's log-probability, (rows,) per call. dtype: the running sum's (default:
    running_dtype of probs' device).
    """
    if probs.dim() != 2 or num_samples != 1 or out is not None:
        return _multinomial(probs, num_samples, replacement, generator=generator, out=out)
    dtype = dtype or running_dtype(probs.device.type)
    running = probs.to(dtype).cumsum(dim=-1)
    draw = torch.rand(probs.shape[0], 1, dtype=dtype, device=probs.device, generator=generator)
    picked = torch.searchsorted(running, draw * running[:, -1:], right=True).clamp_(max=probs.shape[1] - 1)
    if record is not None:
        record.append((probs.gather(1, picked).squeeze(1).to(dtype) / running[:, -1]).log().float())
    return picked


_multinomial = torch.multinomial


def sample(
    generate,
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    record: list | None = None,
    **kwargs,
):
    """generate(input_ids, attention_mask, **kwargs) in eval mode, with repeated prompts prefilled once and
    tokens drawn by inverse_cdf (which appends each step's log-probabilities to record, when given)."""
    training = model.training
    model.eval()
    # generate's sampling step calls torch.multinomial(probs, num_samples=1)
    torch.multinomial = functools.partial(inverse_cdf, record=record)
    try:
        with decode_weights.prepared(model, input_ids.shape[0]):
            if decode_loop.unsupported_model(model) is None:
                kwargs.setdefault("custom_generate", decode_loop.decode)  # prefills each group once itself
            else:
                size = (
                    groups_of(input_ids, attention_mask) if attention_mask is not None and input_ids.shape[1] > 1 else 1
                )
                if size > 1 and "past_key_values" not in kwargs and "cache" not in kwargs:
                    kwargs["cache"] = prefill(model, input_ids[::size, :-1], attention_mask[::size, :-1], size)
            return generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
    finally:
        torch.multinomial = _multinomial
        model.train(training)


def prefill(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, repeats: int):
    """The KV cache of the prompts but their last token (generate runs that one), each row repeated `repeats` times;
    position ids as generate gives left-padded rows."""
    positions = (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 0)
    with torch.no_grad():
        out = model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, use_cache=True, logits_to_keep=1
        )
    cache = getattr(out, "cache", None) or out.past_key_values
    cache.batch_repeat_interleave(repeats)
    return cache


@contextlib.contextmanager
def sampling(model, record: list | None = None):
    """model.generate goes through sample() for the duration (TRL calls it on the same unwrapped model); record
    gets the sampled tokens' log-probabilities, one (rows,) tensor per decoding step."""
    model.generate = functools.partial(sample, type(model).generate.__get__(model), model, record=record)
    try:
        yield
    finally:
        del model.generate
