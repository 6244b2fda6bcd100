"""The output head in chunks: losses and log-probabilities that never build all the (tokens, vocabulary) logits.

For a LoRA run on a small model the output head is most of the work: SmolLM2's 49,152-word vocabulary
makes every scored position cost a 49,152-wide softmax, and on a CPU the tiny test model spends over 90% of
a step there. TRL's own fused head (trl.kernels.ChunkedLogProbFunction) is a Triton kernel on GPUs; on
other devices it falls back to per-tile torch ops, scores every position (prompt and padding included) and
recomputes the tiles in backward. This module does the cheaper thing where Triton is absent:

- only positions whose next-token label is not -100 are projected (prompt and padding cost nothing);
- each chunk of positions is projected once, and its gradient is formed right there (softmax minus
  one-hot, the trick of Liger's fused linear cross-entropy), so backward only scales stored gradients;
- the head's weight gradient is skipped when the head is frozen, as it is under LoRA.

GRPO needs per-token log-probabilities with any upstream gradient (advantage-weighted ratios), so
ChunkedLogProbs keeps the log-sum-exp and recomputes each chunk in backward instead; it scores only the
completion positions, which is most of the saving there.

The loss is the same number as transformers' ForCausalLMLoss (sum over trained tokens divided by their
count, or by num_items_in_batch under gradient accumulation); tests compare the two, and their gradients.
"""

from __future__ import annotations

import torch

from . import unpadded

CHUNK_TOKENS = 1024  # positions projected at once: 1024 x 49,152 fp32 logits is 200 MB


class ChunkedCrossEntropy(torch.autograd.Function):
    """sum(-log softmax(hidden @ weight.T)[target]) * scale, with gradients computed in forward.

    Returns (loss, number of targets that are the argmax); the second has no gradient.
    """

    @staticmethod
    def forward(ctx, hidden, weight, targets, scale: float, chunk: int):
        grad_hidden = torch.empty_like(hidden)
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if weight.requires_grad else None
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        correct = torch.zeros((), dtype=torch.long, device=hidden.device)
        for start in range(0, hidden.shape[0], chunk):
            h, y = hidden[start : start + chunk], targets[start : start + chunk]
            logits = (h @ weight.t()).float()
            target_logit = logits.gather(1, y[:, None]).squeeze(1)
            correct += (target_logit >= logits.max(dim=1).values).sum()
            log_z = torch.logsumexp(logits, dim=1)
            total += (log_z - target_logit).sum()
            probs = logits.sub_(log_z[:, None]).exp_()  # softmax, in place
            probs[torch.arange(y.shape[0], device=y.device), y] -= 1.0  # d(-log p_y)/d logits
            probs.mul_(scale)
            grad_logits = probs.to(h.dtype)
            grad_hidden[start : start + chunk] = grad_logits @ weight
            if grad_weight is not None:
                grad_weight.addmm_(grad_logits.t().float(), h.float())
        ctx.save_for_backward(grad_hidden, grad_weight if grad_weight is not None else torch.empty(0))
        ctx.weight_grad, ctx.weight_dtype = grad_weight is not None, weight.dtype
        ctx.mark_non_differentiable(correct)
        return total * scale, correct

    @staticmethod
    def backward(ctx, grad_loss, _grad_correct):
        grad_hidden, grad_weight = ctx.saved_tensors
        grad_hidden = grad_hidden * grad_loss.to(grad_hidden.dtype)
        grad_weight = (grad_weight * grad_loss).to(ctx.weight_dtype) if ctx.weight_grad else None
        return grad_hidden, grad_weight, None, None, None


def supported(model, lora_targets: str | list[str] = "all-linear") -> str | None:
    """Why the chunked head cannot serve this model, or None when it can.

    Plain causal LMs only: heads with logit scaling, soft-capping or a bias keep TRL's path, and so does an
    adapter on the head itself (the chunked head reads the base weight). float16 does too: the gradient is
    formed in forward, before the loss scaler multiplies it, and its small entries would flush to zero.
    """
    config = model.config.get_text_config()
    head = model.get_output_embeddings()
    odd = [
        key
        for key in (
            "final_logit_softcapping",
            "logit_scale",
            "output_multiplier",
            "lm_head_multiplier",
            "logits_scaling",
        )
        if getattr(config, key, None) not in (None, 1.0)
    ]
    if head is None or getattr(head, "bias", None) is not None or odd:
        return f"the output head has a bias or scaling ({', '.join(odd) or 'bias'})"
    if not isinstance(lora_targets, str) and any(t.split(".")[-1] in ("lm_head", "embed_out") for t in lora_targets):
        return "the LoRA adapter targets the output head"
    if head.weight.dtype == torch.float16:
        return "float16 training (its loss scaler needs the gradient formed in backward)"
    return None


def backbone_and_head(model):
    """The transformer body and the output head of a causal LM, under a PEFT wrapper or not."""
    causal_lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(causal_lm, causal_lm.base_model_prefix), causal_lm.get_output_embeddings()


def use_chunked(speed, model, lora_targets, reporter) -> bool:
    """Whether a trainer takes the chunked head; says why not when it was asked for and cannot.

    With torch_compile on, the backbone is compiled in place here: the chunked path calls it directly, past
    the compiled wrapper that the trainer would build.
    """
    if speed.loss_kernel != "chunked":
        return False
    reason = supported(model, lora_targets)
    if reason:
        reporter.log(f"loss kernel: using TRL's head, since the chunked one does not support {reason}")
        return False
    if speed.torch_compile:
        backbone_and_head(model)[0].compile()
    return True


def through_wrapper(model, fn, *args):
    """fn(the wrapped model, *args), run as the forward of model's DistributedDataParallel wrapper if it has one.

    The chunked paths call the backbone and the head themselves, past the model's forward. DDP all-reduces the
    gradients only of a backward that follows its own forward (which readies its reducer), so under data
    parallelism fn stands in for the inner model's forward for one call: the gradients then synchronise as
    for any model call, bucketed and overlapped with the backward. Without DDP (one process) fn is called
    directly, as before.
    """
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(model, DistributedDataParallel):
        return fn(model, *args)
    inner = model.module
    if not torch.is_grad_enabled():  # nothing to synchronise (reference and old-policy log-probs)
        return fn(inner, *args)
    shadowed = inner.__dict__.get("forward")  # accelerate may have put its own (autocast) forward there
    inner.forward = lambda *passed: fn(inner, *passed)
    try:
        return model(*args)
    finally:
        if shadowed is None:
            del inner.forward
        else:
            inner.forward = shadowed


STATS = ("entropy", "mean_logits", "is_top1", "log_sum_sq_probs")  # what TRL's fused head can also return


class ChunkedLogProbs(torch.autograd.Function):
    """log softmax(hidden @ weight.T / temperature)[target] per row, and the STATS asked for (without gradient):
    entropy, mean logit, whether the target is the top token, log sum of squared probabilities (WPO's weights).

    The gradient of a row's log-probability with respect to its hidden state does not depend on what comes
    after it: (weight[target] - softmax @ weight) / temperature, which the upstream gradient (GRPO's
    advantage-weighted ratio, DPO's sigmoid) only scales. With the head frozen (LoRA) forward forms it while the
    chunk's softmax is at hand, and backward is one multiplication: the logits are projected once, not again in
    backward. A trainable head needs the logits again for its weight gradient, and they are recomputed there.
    """

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature: float, chunk: int, stats: tuple = ("entropy",)):
        n = hidden.shape[0]
        logps = torch.empty(n, dtype=torch.float32, device=hidden.device)
        log_z = torch.empty_like(logps)
        extra = {
            name: torch.empty(
                n if name in stats else 0,
                dtype=torch.bool if name == "is_top1" else torch.float32,
                device=hidden.device,
            )
            for name in STATS
        }
        direction = torch.empty_like(hidden) if ctx.needs_input_grad[0] and not ctx.needs_input_grad[1] else None
        for start in range(0, n, chunk):
            rows = slice(start, start + chunk)
            logits = (hidden[rows] @ weight.t()).float().div_(temperature)
            log_z[rows] = torch.logsumexp(logits, dim=1)
            target_logit = logits.gather(1, targets[rows, None]).squeeze(1)
            logps[rows] = target_logit - log_z[rows]
            if "mean_logits" in stats:
                extra["mean_logits"][rows] = logits.mean(dim=1)
            if "is_top1" in stats:
                extra["is_top1"][rows] = target_logit >= logits.max(dim=1).values
            if not ({"entropy", "log_sum_sq_probs"} & set(stats)) and direction is None:
                continue
            log_probs = logits.sub_(log_z[rows, None])  # in place: logits are not needed after this
            if "log_sum_sq_probs" in stats:
                extra["log_sum_sq_probs"][rows] = torch.logsumexp(2 * log_probs, dim=1)
            if "entropy" not in stats and direction is None:
                continue
            probs = log_probs.exp()
            if "entropy" in stats:  # -sum p log p, as a row-by-row dot product (no third (rows, vocab) buffer)
                extra["entropy"][rows] = -(probs[:, None, :] @ log_probs[:, :, None]).view(-1)
            if direction is not None:
                expected = probs.to(weight.dtype) @ weight  # the softmax-weighted mean of the output embeddings
                direction[rows] = (weight[targets[rows]] - expected).div_(temperature)
        if direction is not None:
            ctx.save_for_backward(direction)
        else:
            ctx.save_for_backward(hidden, weight, targets, log_z)
        ctx.temperature, ctx.chunk, ctx.formed = temperature, chunk, direction is not None
        ctx.mark_non_differentiable(*extra.values())
        return logps, *extra.values()

    @staticmethod
    def backward(ctx, grad_logps, *_grad_stats):
        if ctx.formed:  # in forward: the head is frozen
            (direction,) = ctx.saved_tensors
            return direction * grad_logps.to(direction.dtype)[:, None], None, None, None, None, None
        hidden, weight, targets, log_z = ctx.saved_tensors
        grad_hidden = torch.empty_like(hidden)
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if ctx.needs_input_grad[1] else None
        for start in range(0, hidden.shape[0], ctx.chunk):
            rows = slice(start, start + ctx.chunk)
            h, g = hidden[rows], grad_logps[rows].float()
            # d logp_y / d logits = onehot(y) - softmax; times the upstream gradient, over the temperature
            grad_logits = (h @ weight.t()).float().div_(ctx.temperature).sub_(log_z[rows, None]).exp_()
            grad_logits.mul_(-g[:, None])
            grad_logits[torch.arange(h.shape[0], device=h.device), targets[rows]] += g
            grad_logits = grad_logits.div_(ctx.temperature).to(h.dtype)
            grad_hidden[rows] = grad_logits @ weight
            if grad_weight is not None:
                grad_weight.addmm_(grad_logits.t().float(), h.float())
        return grad_hidden, None if grad_weight is None else grad_weight.to(weight.dtype), None, None, None, None


def logprobs(
    hidden, weight, targets, temperature: float = 1.0, chunk: int | None = None, stats: tuple = ("entropy",)
) -> dict:
    """{"log_probs": ..., and each of stats}: ChunkedLogProbs of the rows of hidden against targets."""
    values = ChunkedLogProbs.apply(hidden, weight, targets, temperature, chunk or CHUNK_TOKENS, tuple(stats))
    return {"log_probs": values[0], **{name: v for name, v in zip(STATS, values[1:]) if name in stats}}


def scored_hidden(
    model, score: torch.Tensor, unpad: bool = False, replies: torch.Tensor | None = None, **inputs
) -> torch.Tensor:
    """The backbone's last hidden states at the positions score marks, (marked positions, hidden).

    score is (rows, length - 1): True where position t predicts a scored token t + 1. With unpad the backbone runs
    over the real tokens only (unpadded.py); its hidden states at the real positions are the same. replies, like
    score, marks the reply tokens of DPO's [chosen; rejected] rows: a pair's common prompt then runs once.
    """
    backbone, _ = backbone_and_head(model)
    attention_mask = inputs.pop("attention_mask", None)
    if unpad and attention_mask is not None and attention_mask.shape[0] > 1:
        starts = None if replies is None else replies.int().argmax(dim=1) + 1
        flat, index = unpadded.hidden_states(backbone, attention_mask=attention_mask, reply_starts=starts, **inputs)
        rows = index[:, :-1][score.to(attention_mask.device)]
        if bool((rows < 0).any()):
            raise ValueError("a scored token follows padding: rows must be padded on the left or the right only")
        return flat[rows]
    hidden = backbone(attention_mask=attention_mask, use_cache=False, **inputs).last_hidden_state[:, :-1]
    return hidden[score.to(hidden.device)]


def causal_lm_loss(
    model, inputs: dict, labels: torch.Tensor, num_items_in_batch=None, unpad: bool = False
) -> tuple[torch.Tensor, dict]:
    """Loss of a (PEFT-wrapped) causal LM on labels, and {"tokens": trained tokens, "correct": top-1 hits}."""
    _, head = backbone_and_head(model)
    passed = {k: v for k, v in inputs.items() if k != "labels"}  # packed batches carry cu_seq_lens and the like
    targets = labels[:, 1:]
    mask = targets != -100
    hidden = scored_hidden(model, mask, unpad, **passed)
    count = mask.sum()
    denominator = num_items_in_batch if num_items_in_batch is not None else count.clamp(min=1)
    scale = 1.0 / float(denominator)
    loss, correct = ChunkedCrossEntropy.apply(hidden, head.weight, targets[mask].to(hidden.device), scale, CHUNK_TOKENS)
    return loss, {"tokens": int(count), "correct": int(correct)}


def completion_logprobs(
    model,
    input_ids,
    attention_mask,
    n_completion: int,
    temperature: float = 1.0,
    chunk: int | None = None,
    unpad: bool = False,
    entropy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities and entropies (None unless entropy) of the last n_completion tokens of each row,
    (rows, n_completion) each; zero where attention_mask is 0, as TRL returns them. Padding after a completion
    costs nothing; with unpad, a prompt shared by several rows (a GRPO group) runs once."""
    _, head = backbone_and_head(model)
    score = torch.zeros(input_ids.shape[0], input_ids.shape[1] - 1, dtype=torch.bool, device=input_ids.device)
    score[:, -n_completion:] = attention_mask[:, -n_completion:] != 0
    replies = torch.zeros_like(score)
    replies[:, -n_completion:] = True  # every completion starts at the same column: prompts are left-padded
    hidden = scored_hidden(model, score, unpad, replies, input_ids=input_ids, attention_mask=attention_mask)
    out = logprobs(
        hidden, head.weight, input_ids[:, 1:][score], temperature, chunk, stats=("entropy",) if entropy else ()
    )
    shape = (input_ids.shape[0], n_completion)
    return tuple(
        None if x is None else x.new_zeros(score.shape).masked_scatter(score, x)[:, -n_completion:].reshape(shape)
        for x in (out["log_probs"], out.get("entropy"))
    )
