"""A decoding loop of this project's own for Llama-family models, run as `model.generate`'s `custom_generate`.

transformers prepares the call as always (the generation config merged with the model's, special tokens, the logits
processors and stopping criteria, lengths, left-padding checks); then this loop decodes instead of its `_sample`. A
sampling step for eight rows is a few dozen small products, so on a CPU the work around them counted: generate's
per-token model-input preparation and mask building, about ten nn.Module calls a layer (PEFT's and transformers'
per-call checks included) and a KV cache concatenated anew at every token. Here:

- the KV cache is preallocated once for the whole call (layers x rows x the prompt plus max_new_tokens) and written in
  place; attention reads a view of its filled part;
- one function runs the decoder layer by layer on the products decode_weights prepared (q/k/v and gate/up one
  product each, read as views of its output), with no mask built per step (a boolean row of valid positions grows);
- rows that repeat a prompt (a GRPO group) prefill it once; its cache and first logits are repeated for the group;
- a single query's grouped-query attention runs as one product per KV head with its query heads stacked (what
  transformers' sdpa path calls pack_gqa), with no repeated keys.

Tokens are chosen as `_sample` chooses them: the same logits processors (temperature, top-k, top-p, penalties, ...),
softmax, `torch.multinomial` looked up at each call (rollout's inverse-CDF draw when it is swapped in) or argmax,
finished rows padded, the same stopping criteria and streamer calls. Greedy decoding gives generate's tokens and
sampling its distribution (tests/engine/infer/test_decode_loop.py). What the loop does not cover runs transformers'
own decoding method instead, said once in the log: another architecture, beam search and other modes, returned
dicts (scores, hidden states), synced GPUs, a cache handed in, input embeddings.

A streamer is passed as `token_streamer`: generate hands its own `streamer` argument only to its built-in methods.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
import torch.nn.functional as F

from .decode_weights import FusedPart

log = logging.getLogger("dragon_dagster")

# Architectures whose decoder layer is Llama's: pre-norm RMSNorm, rotary q/k, grouped-query attention, a gated MLP.
ARCHITECTURES = ("llama", "qwen2")
_said: set[str] = set()


def decode(
    model,
    input_ids: torch.LongTensor,
    logits_processor,
    stopping_criteria,
    generation_config,
    synced_gpus: bool = False,
    token_streamer=None,
    **model_kwargs,
) -> torch.LongTensor:
    """generate's decoding method (pass as `custom_generate=decode`): the prompt and the new tokens, (rows, length)."""
    reason = unsupported(model, generation_config, synced_gpus, model_kwargs)
    if token_streamer is not None:
        token_streamer.put(input_ids.cpu())
    if reason:  # the decoding method generate would have run
        from transformers.generation.utils import GENERATION_MODES_MAPPING

        if reason not in _said:
            _said.add(reason)
            log.info("decoding with transformers' own loop: this project's does not cover %s", reason)
        method = getattr(type(model), GENERATION_MODES_MAPPING[generation_config.get_generation_mode()])
        return method(
            model,
            input_ids,
            logits_processor=logits_processor,
            stopping_criteria=stopping_criteria,
            generation_config=generation_config,
            synced_gpus=synced_gpus,
            streamer=token_streamer,
            **model_kwargs,
        )
    with torch.no_grad():
        return _decode(
            causal_lm(model),
            input_ids,
            model_kwargs.get("attention_mask"),
            logits_processor,
            stopping_criteria,
            generation_config,
            token_streamer,
        )


def causal_lm(model):
    """The transformers model under a PEFT wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def unsupported(model, generation_config, synced_gpus: bool = False, model_kwargs: dict | None = None) -> str | None:
    """Why this loop cannot decode this call (None when it can), in words for the log."""
    reason = unsupported_model(model) or unsupported_call(generation_config, synced_gpus)
    if reason:
        return reason
    model_kwargs = model_kwargs or {}
    if model_kwargs.get("inputs_embeds") is not None:
        return "inputs_embeds"
    cache = model_kwargs.get("cache")
    if cache is not None and cache.get_seq_length() > 0:
        return "a cache handed in with tokens in it"
    return None


def unsupported_model(model) -> str | None:
    """Why this loop cannot run this model (None when it can)."""
    lm = causal_lm(model)
    config = lm.config
    if config.model_type not in ARCHITECTURES:
        return f"the {config.model_type!r} architecture (the loop runs {', '.join(ARCHITECTURES)})"
    backbone = getattr(lm, "model", None)
    if not all(hasattr(backbone, name) for name in ("embed_tokens", "layers", "norm", "rotary_emb")):
        return f"a {type(lm).__name__} without Llama's embed_tokens, layers, norm and rotary_emb"
    if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or []):
        return "sliding-window attention layers"
    return None


def unsupported_call(generation_config, synced_gpus: bool = False) -> str | None:
    """Why this loop cannot decode with these generation settings (None when it can)."""
    from transformers.generation.configuration_utils import GenerationMode

    mode = generation_config.get_generation_mode()
    if mode not in (GenerationMode.SAMPLE, GenerationMode.GREEDY_SEARCH):
        return f"the generation mode {mode.value!r} (the loop samples or decodes greedily)"
    if generation_config.return_dict_in_generate:
        return "return_dict_in_generate (scores, logits or hidden states asked for)"
    if synced_gpus:
        return "synced_gpus"
    return None


def groups_of(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> int:
    """How many consecutive rows repeat each prompt (TRL's rows: each prompt group_size times); 1 when they do not."""
    rows = input_ids.shape[0]
    size = 1
    while (
        size < rows
        and torch.equal(input_ids[size], input_ids[0])
        and torch.equal(attention_mask[size], attention_mask[0])
    ):
        size += 1
    if size < 2 or rows % size:
        return 1
    firsts = torch.arange(rows, device=input_ids.device) // size * size
    alike = torch.equal(input_ids, input_ids[firsts]) and torch.equal(attention_mask, attention_mask[firsts])
    return size if alike else 1


def _decode(lm, input_ids, attention_mask, logits_processor, stopping_criteria, generation_config, streamer):
    rows, prompt = input_ids.shape
    device = input_ids.device
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    capacity = max(generation_config.max_length, prompt + 1)
    decoder = Decoder(lm, rows, capacity)
    valid = torch.zeros(rows, capacity, dtype=torch.bool, device=device)  # positions a query may attend to
    valid[:, :prompt] = attention_mask.bool()
    positions = (attention_mask.long().cumsum(-1) - 1).clamp_(min=0)  # generate's positions for left padding
    size = groups_of(input_ids, attention_mask) if rows > 1 else 1
    hidden = decoder.forward(input_ids[::size], positions[::size], 0, valid[::size, :prompt])
    logits = decoder.logits(hidden[:, -1])
    if size > 1:
        decoder.repeat_rows(size, prompt)
        logits = logits.repeat_interleave(size, dim=0)
    following = positions[:, -1:] + 1  # each row's next position
    ids = torch.empty(rows, capacity, dtype=input_ids.dtype, device=device)
    ids[:, :prompt] = input_ids
    length = prompt
    unfinished = torch.ones(rows, dtype=torch.long, device=device)
    pad = generation_config._pad_token_tensor
    pads_finished = any(hasattr(criteria, "eos_token_id") for criteria in stopping_criteria)
    while True:
        scores = logits_processor(ids[:, :length], logits)
        if generation_config.do_sample:
            # looked up at each call, as generate's _sample does: rollout swaps in its inverse-CDF draw
            chosen = torch.multinomial(F.softmax(scores, dim=-1), num_samples=1).squeeze(1)
        else:
            chosen = torch.argmax(scores, dim=-1)
        if pads_finished:
            chosen = chosen * unfinished + pad * (1 - unfinished)
        ids[:, length] = chosen
        length += 1
        unfinished = unfinished & ~stopping_criteria(ids[:, :length], None)
        if streamer is not None:
            streamer.put(chosen.cpu())
        if unfinished.max() == 0 or length >= capacity:
            break
        valid[:, length - 1] = True
        hidden = decoder.forward(chosen[:, None], following, length - 1, valid[:, :length])
        logits = decoder.logits(hidden[:, -1])
        following += 1
    if streamer is not None:
        streamer.end()
    return ids[:, :length].clone()


def product(module) -> Callable[[torch.Tensor], torch.Tensor]:
    """What computes a linear layer's output: its packed product when decode_weights prepared one and PEFT would run
    the base layer alone (adapters folded in, or none active), otherwise the module itself."""
    base = module.get_base_layer() if hasattr(module, "get_base_layer") else module
    packed = base.__dict__.get("forward")
    if packed is not None and (base is module or module.merged or module.disable_adapters):
        return packed
    return module


def stacked(modules: list) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """One product for layers that decode_weights packed together, in this order (None when they were not)."""
    parts = [product(m) for m in modules]
    if not all(isinstance(p, FusedPart) for p in parts):
        return None
    fused = parts[0].fused
    if any(p.fused is not fused for p in parts) or [p.index for p in parts] != list(range(len(parts))):
        return None
    if len(fused.sizes) != len(parts):
        return None
    return fused.stacked


class Layer:
    """One decoder layer's weights and products, looked up once a call."""

    def __init__(self, layer, config):
        attn, mlp = layer.self_attn, layer.mlp
        self.norm1 = (layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon)
        self.norm2 = (layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon)
        self.head_dim = attn.head_dim
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.scaling = attn.scaling
        self.q_size, self.kv_size = self.heads * self.head_dim, self.kv_heads * self.head_dim
        self.qkv = stacked([attn.q_proj, attn.k_proj, attn.v_proj])
        self.q, self.k, self.v = product(attn.q_proj), product(attn.k_proj), product(attn.v_proj)
        self.o = product(attn.o_proj)
        self.gate_up = stacked([mlp.gate_proj, mlp.up_proj])
        self.gate, self.up, self.down = product(mlp.gate_proj), product(mlp.up_proj), product(mlp.down_proj)
        self.act = F.silu if config.hidden_act == "silu" else mlp.act_fn

    def projections(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.qkv is not None:
            return self.qkv(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        return self.q(x), self.k(x), self.v(x)

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up is not None:
            gate, up = self.gate_up(x).chunk(2, dim=-1)
        else:
            gate, up = self.gate(x), self.up(x)
        return self.down(self.act(gate) * up)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """LlamaRMSNorm's forward, op for op (the same values as the model's own)."""
    hidden = x.to(torch.float32)
    hidden = hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + eps)
    return weight * hidden.to(x.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding as transformers' apply_rotary_pos_emb (x * cos + rotate_half(x) * sin)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class Decoder:
    """The model's forward over a preallocated KV cache: `forward` writes keys and values of new tokens at a slot."""

    def __init__(self, lm, rows: int, capacity: int):
        backbone = lm.model
        config = lm.config
        self.embed, self.rotary, self.final_norm = backbone.embed_tokens, backbone.rotary_emb, backbone.norm
        self.head = product(lm.get_output_embeddings())
        self.layers = [Layer(layer, config) for layer in backbone.layers[: config.num_hidden_layers]]
        first = self.layers[0]
        weight = self.embed.weight
        shape = (len(self.layers), rows, first.kv_heads, capacity, first.head_dim)
        self.keys = torch.empty(shape, dtype=weight.dtype, device=weight.device)
        self.values = torch.empty(shape, dtype=weight.dtype, device=weight.device)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, start: int, valid: torch.Tensor) -> torch.Tensor:
        """Hidden states of `ids` (rows, n) at cache slots start..start+n-1 for the first `rows` rows of the cache;
        valid (rows, start + n): the positions each row attends to (its padding False)."""
        rows, n = ids.shape
        end = start + n
        hidden = self.embed(ids)
        cos, sin = self.rotary(hidden, positions)
        cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)  # (rows, n, 1, head_dim): over every head
        if n == 1:
            mask = valid[:, None, None, :]
        else:  # causal over the new tokens; a padding query attends to itself (no row of its softmax is empty)
            causal = torch.ones(n, end, dtype=torch.bool, device=ids.device).tril(start)
            itself = torch.zeros(n, end, dtype=torch.bool, device=ids.device)
            itself[:, start:].fill_diagonal_(True)
            mask = ((causal & valid[:, None, :]) | itself)[:, None]
        for i, layer in enumerate(self.layers):
            x = rms_norm(hidden, *layer.norm1)
            q, k, v = layer.projections(x)
            q = rotate(q.view(rows, n, layer.heads, layer.head_dim), cos, sin)
            k = rotate(k.view(rows, n, layer.kv_heads, layer.head_dim), cos, sin)
            self.keys[i, :rows, :, start:end] = k.transpose(1, 2)
            self.values[i, :rows, :, start:end] = v.view(rows, n, layer.kv_heads, layer.head_dim).transpose(1, 2)
            keys, values = self.keys[i, :rows, :, :end], self.values[i, :rows, :, :end]
            if n == 1:  # each KV head's query heads as its queries: no keys repeated
                q = q.view(rows, layer.kv_heads, layer.heads // layer.kv_heads, layer.head_dim)
                out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=layer.scaling)
            else:
                out = F.scaled_dot_product_attention(
                    q.transpose(1, 2),
                    keys,
                    values,
                    attn_mask=mask,
                    scale=layer.scaling,
                    enable_gqa=layer.heads != layer.kv_heads,
                ).transpose(1, 2)
            hidden = hidden + layer.o(out.reshape(rows, n, layer.q_size))
            hidden = hidden + layer.mlp(rms_norm(hidden, *layer.norm2))
        return hidden

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits of hidden states (rows, hidden_size)."""
        return self.head(self.final_norm(hidden)).float()

    def repeat_rows(self, times: int, length: int) -> None:
        """The cache's first rows/times rows, each repeated `times` times, over slots 0..length-1 (a prompt group)."""
        rows = self.keys.shape[1]
        for cache in (self.keys, self.values):
            cache[:, :, :, :length] = cache[:, : rows // times, :, :length].repeat_interleave(times, dim=1)
