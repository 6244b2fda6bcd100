"""Replies from a local model: batched, left-padded generation over chat prompts through this project's decoding
loop (decode_loop.py), on folded and packed decoding weights on a CPU (decode_weights.py). Trainers sample with it,
evaluation scores its replies, chat streams."""

from __future__ import annotations


def generate(
    model,
    tokenizer,
    prompts: list[list[dict]],
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    top_p: float = 1.0,
    batch_size: int = 8,
    seed: int = 42,
    tools: list[dict] | None = None,
) -> list[str]:
    """Replies to chat prompts (lists of messages), batched with left padding. temperature 0 is greedy. tools:
    the pipeline's tool schemas, rendered by the chat template (tools/template.py prepared it)."""
    import torch

    from . import decode_weights

    device = next(model.parameters()).device
    tokenizer.padding_side = "left"
    torch.manual_seed(seed)
    replies = []
    with decode_weights.prepared(model, min(batch_size, len(prompts)) or 1):  # CPU: folded, packed weights
        for start in range(0, len(prompts), batch_size):
            replies += generate_batch(
                model, tokenizer, prompts[start : start + batch_size], device, max_new_tokens, temperature, top_p, tools
            )
    return replies


def generate_batch(
    model,
    tokenizer,
    prompts: list[list[dict]],
    device,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    tools: list[dict] | None = None,
) -> list[str]:
    """Replies to one batch of chat prompts, left-padded together."""
    import torch

    from . import decode_loop

    texts = [
        tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True, tools=tools or None)
        for p in prompts
    ]
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
    sampling = (
        {"do_sample": True, "temperature": temperature, "top_p": top_p}
        if temperature > 0
        else {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
    )
    with torch.no_grad():
        out = model.generate(
            **batch,
            max_new_tokens=max_new_tokens,
            pad_token_id=tokenizer.pad_token_id,
            custom_generate=decode_loop.decode,  # this project's loop (generate's own where it does not apply)
            **sampling,
        )
    new = out[:, batch["input_ids"].shape[1] :]
    return [t.strip() for t in tokenizer.batch_decode(new, skip_special_tokens=True)]
