"""Padding-free forward passes: the backbone runs over a batch's real tokens only.

A batch of rows padded to its longest costs (rows x longest) positions in every matmul of every layer: the
peer's SFT rows at batch 4 are 17% padding, DPO's chosen and rejected replies side by side more. Here the real
tokens of all rows are laid end to end in one row, and attention runs over each original row on its own
(scaled_dot_product_attention, causal, per segment), so no token attends across rows and no (tokens x tokens)
block mask is built, which is what made plain packing slower than padding on a CPU.

Each token keeps the position id it had in the padded batch, so the hidden states are those of the padded
forward (tests/engine/train/test_unpadded.py compares values and gradients, left and right padding).

A pass can also continue an earlier one (continue_pass): its segments attend first to a stretch of the earlier
pass's keys and values, recorded while it ran (recording), as a KV cache would hold them. KTO's mismatched replies
take their prompts' keys and values from the pass that ran those prompts with the rated replies.

The attention is registered with transformers' AttentionInterface under NAME. Calls that carry no segment
boundaries (generation, evaluation) fall through to transformers' own SDPA, mask included.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, field

import torch

NAME = "dragon_unpadded"
_unpadding = contextvars.ContextVar("dragon_unpadded", default=False)
_recording = contextvars.ContextVar("dragon_unpadded_recording", default=None)  # Recorded being filled
_continuing = contextvars.ContextVar("dragon_unpadded_continuing", default=None)  # Recorded prefixes index into


@dataclass
class Recorded:
    """What a padding-free pass leaves for a pass that continues it: each attention layer's keys and values over
    the flat row (detached, as a KV cache holds them), and the last hidden states with layout's index into them."""

    keys_values: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    hidden: torch.Tensor | None = None  # (flat tokens, hidden), detached
    index: torch.Tensor | None = None  # (rows, length): flat position of each padded position, -1 for padding


@contextlib.contextmanager
def recording():
    """Record the padding-free passes run inside (the last one wins) into the Recorded this yields."""
    recorded = Recorded()
    token = _recording.set(recorded)
    try:
        yield recorded
    finally:
        _recording.reset(token)


def attention(
    module,
    query,
    key,
    value,
    attention_mask,
    dropout=0.0,
    scaling=None,
    cu_seq_lens_q=None,
    shared_prefixes=None,
    **kwargs,
):
    """SDPA over each segment of a padding-free row when cu_seq_lens_q bounds them; transformers' SDPA otherwise.

    shared_prefixes[i] = (start, end) gives segment i a prefix elsewhere in the row that it attends to in full
    before its own tokens (a prompt shared by a chosen and a rejected reply); None for none. In a pass that
    continues a recorded one, the prefixes are stretches of the recorded pass's row instead.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if cu_seq_lens_q is None or query.shape[0] != 1:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    recorded, continued = _recording.get(), _continuing.get()
    if recorded is not None and continued is None:
        recorded.keys_values[module.layer_idx] = (key.detach(), value.detach())
    prefix_key, prefix_value = continued.keys_values[module.layer_idx] if continued is not None else (key, value)
    bounds = cu_seq_lens_q.tolist()
    outputs = []
    for i, (start, end) in enumerate(zip(bounds, bounds[1:])):
        prefix = shared_prefixes[i] if shared_prefixes else None
        q, k, v = query[:, :, start:end], key[:, :, start:end], value[:, :, start:end]
        if prefix is None:
            outputs.append(
                sdpa_attention_forward(module, q, k, v, None, dropout=dropout, scaling=scaling, is_causal=True)[0]
            )
            continue
        k = torch.cat([prefix_key[:, :, prefix[0] : prefix[1]], k], dim=2)
        v = torch.cat([prefix_value[:, :, prefix[0] : prefix[1]], v], dim=2)
        n, m = end - start, prefix[1] - prefix[0]
        allowed = torch.ones(n, m + n, dtype=torch.bool, device=query.device)
        allowed[:, m:] = torch.ones(n, n, dtype=torch.bool, device=query.device).tril()
        outputs.append(
            sdpa_attention_forward(module, q, k, v, allowed[None, None], dropout=dropout, scaling=scaling)[0]
        )
    return torch.cat(outputs, dim=1), None


def mask(*args, **kwargs):
    """No mask while unpadded() runs (attention keeps to each segment); transformers' SDPA mask otherwise."""
    from transformers.masking_utils import sdpa_mask

    return None if _unpadding.get() else sdpa_mask(*args, **kwargs)


def use(model) -> None:
    """Switch model (a causal LM, PEFT-wrapped or not) to the segment-wise attention."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, attention)
    AttentionMaskInterface.register(NAME, mask)
    causal_lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    causal_lm.set_attn_implementation(NAME)


@dataclass
class Layout:
    """Where each real token of a padded batch goes in the one padding-free row."""

    tokens: torch.Tensor  # (real tokens,) ids, row after row
    positions: torch.Tensor  # (real tokens,) the position ids the padded batch gives them
    index: torch.Tensor  # (rows, length): flat position of each padded position, -1 for padding
    bounds: list[int]  # segment boundaries in the flat row
    prefixes: list[tuple[int, int] | None]  # per segment: a shared prefix it attends to first


def layout(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor | None = None,
    reply_starts: torch.Tensor | None = None,
) -> Layout:
    """Each row's real tokens as one segment. With reply_starts (the column where each row's reply begins), rows whose
    prompts are the same tokens at the same columns (DPO's chosen and rejected, a GRPO group's completions) lay
    the prompt down once, in the first such row, and the later rows' replies attend to it there."""
    keep = attention_mask.bool()
    rows, length = keep.shape
    if position_ids is None:
        position_ids = torch.arange(length, device=keep.device).expand_as(keep)
    shared = shared_prompts(input_ids, keep, reply_starts) if reply_starts is not None else {}
    index = torch.full(keep.shape, -1, dtype=torch.long, device=keep.device)
    pieces, bounds, prefixes, at = [], [0], [], 0
    for row in range(rows):
        columns = keep[row].nonzero().flatten()
        source = shared.get(row)
        if source is not None:  # its prompt positions point at the source row's copy
            source, first, start = source
            index[row, first:start] = index[source, first:start]
            columns = columns[columns >= start]
        index[row, columns] = torch.arange(at, at + len(columns), device=keep.device)
        pieces.append(columns + row * length)
        if len(columns):
            at += len(columns)
            bounds.append(at)
            prefixes.append(None if source is None else (int(index[row, first]), int(index[row, start - 1]) + 1))
    flat = torch.cat(pieces)
    return Layout(input_ids.reshape(-1)[flat], position_ids.reshape(-1)[flat], index, bounds, prefixes)


def shared_prompts(input_ids, keep, reply_starts) -> dict[int, tuple[int, int, int]]:
    """{row: (source row, first prompt column, reply start)} for each row whose prompt an earlier row has: the same
    tokens at the same columns, all real, followed by a reply in both."""
    first_real = keep.int().argmax(dim=1).tolist()
    starts = reply_starts.tolist()
    seen: dict[tuple, int] = {}
    shared = {}
    for row, (first, start) in enumerate(zip(first_real, starts)):
        if start <= first or start >= keep.shape[1] or not bool(keep[row, first:start].all()):
            continue
        key = (first, start, *input_ids[row, first:start].tolist())
        if key in seen:
            shared[row] = (seen[key], first, start)
        else:
            seen[key] = row
    return shared


def hidden_states(
    backbone, input_ids: torch.Tensor, attention_mask: torch.Tensor, reply_starts=None, **kwargs
) -> tuple[torch.Tensor, torch.Tensor]:
    """The backbone's last hidden states of the real tokens, (flat tokens, hidden), and layout's index into them.

    kwargs go to the backbone (the padded batch's other inputs); position ids are those the padded batch has.
    Inside recording(), the pass's keys, values and hidden states are recorded.
    """
    flat = layout(input_ids, attention_mask, kwargs.pop("position_ids", None), reply_starts)
    hidden = flat_hidden_states(backbone, flat.tokens, flat.positions, flat.bounds, flat.prefixes, **kwargs)
    recorded = _recording.get()
    if recorded is not None:
        recorded.hidden, recorded.index = hidden.detach(), flat.index
    return hidden, flat.index


def continue_pass(
    backbone,
    recorded: Recorded,
    tokens: torch.Tensor,
    positions: torch.Tensor,
    bounds: list[int],
    prefixes: list[tuple[int, int]],
) -> torch.Tensor:
    """The last hidden states of segments (tokens laid end to end, bounds between them) each continuing a stretch
    of a recorded pass: segment i attends to the recorded keys and values at flat positions prefixes[i] first, as
    if those tokens came before it in its row. positions are the segment tokens' position ids."""
    token = _continuing.set(recorded)
    try:
        return flat_hidden_states(backbone, tokens, positions, bounds, prefixes)
    finally:
        _continuing.reset(token)


def flat_hidden_states(backbone, tokens, positions, bounds: list[int], prefixes: list, **kwargs) -> torch.Tensor:
    """The backbone over one padding-free row of segments; (tokens, hidden)."""
    if backbone.config._attn_implementation != NAME:  # SDPA would ignore the bounds and attend across rows
        raise RuntimeError(
            f"unpadded forward on a model whose attention is {backbone.config._attn_implementation!r}; "
            f"call unpadded.use(model) first"
        )
    cu = torch.tensor(bounds, dtype=torch.int32, device=tokens.device)
    longest = int(cu.diff().max())
    token = _unpadding.set(True)
    try:
        out = backbone(
            input_ids=tokens[None],
            position_ids=positions[None],
            use_cache=False,
            cu_seq_lens_q=cu,
            cu_seq_lens_k=cu,
            max_length_q=longest,
            max_length_k=longest,
            shared_prefixes=prefixes if any(prefixes) else None,
            **kwargs,
        )
    finally:
        _unpadding.reset(token)
    return out.last_hidden_state[0]
