"""How likely a model finds a reply: summed log-probabilities of reply tokens given their prompt turns, and the
held-out loss and perplexity made of them (every stage's eval/loss is computed here, one way)."""

from __future__ import annotations

import math

from ..data.row_parts import reply_text


def encode_reply(tokenizer, row: dict, max_len: int) -> tuple[list[int], int]:
    """Token ids of prompt+reply (the completion, or a pair's chosen reply), and how many leading tokens are
    prompt (no loss there)."""
    tools = row.get("tools")  # a row's tool schemas are part of its context, as in training
    prompt = tokenizer.apply_chat_template(row["prompt"], tools=tools, tokenize=False, add_generation_prompt=True)
    reply = row["completion"] if "completion" in row else row["chosen"]
    full = tokenizer.apply_chat_template(row["prompt"] + reply, tools=tools, tokenize=False)
    if not full.startswith(prompt):  # templates that rewrite earlier turns: fall back to concatenation
        full = prompt + reply_text(row) + (tokenizer.eos_token or "")
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    full_ids = tokenizer(full, add_special_tokens=False)["input_ids"]
    return full_ids[:max_len], min(len(prompt_ids), max_len)


def reply_logprobs(
    model, tokenizer, rows: list[dict], max_len: int = 1024, batch_size: int = 8
) -> list[tuple[float, int]]:
    """(summed log-probability, token count) of each row's reply (its completion, or a pair's chosen reply)
    given its prompt turns: what a KTO/DPO implicit reward and the held-out loss are made of."""
    import torch

    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    out = []
    for start in range(0, len(rows), batch_size):
        encoded = [encode_reply(tokenizer, r, max_len) for r in rows[start : start + batch_size]]
        width = max(len(ids) for ids, _ in encoded)
        input_ids = torch.full((len(encoded), width), pad, dtype=torch.long)
        labels = torch.full_like(input_ids, -100)
        attention = torch.zeros_like(input_ids)
        for i, (ids, n_prompt) in enumerate(encoded):
            input_ids[i, : len(ids)] = torch.tensor(ids)
            attention[i, : len(ids)] = 1
            labels[i, n_prompt : len(ids)] = torch.tensor(ids[n_prompt:], dtype=torch.long)
        # the logits of the prompt turns score nothing: the head projects only the positions from the first that
        # predicts a reply token (rows are right-padded, so one slice serves the batch)
        start = max(0, min(n_prompt for _, n_prompt in encoded) - 1)
        with torch.no_grad():
            logits = model(
                input_ids=input_ids.to(device), attention_mask=attention.to(device), logits_to_keep=width - start
            ).logits
        shift_labels = labels[:, start + 1 :].to(device)
        scored = shift_labels != -100
        # cross-entropy over the reply tokens alone, (tokens, vocabulary) contiguous: over the whole (batch,
        # vocabulary, positions) it cost seconds a batch on a CPU, mostly in the transposed layout
        nll = torch.zeros(scored.shape, device=device)
        nll[scored] = torch.nn.functional.cross_entropy(
            logits[:, :-1][scored].float(), shift_labels[scored], reduction="none"
        )
        out += [(-float(total), int(n)) for total, n in zip(nll.sum(dim=1), scored.sum(dim=1))]
    return out


def completion_loss(model, tokenizer, rows: list[dict], max_len: int = 1024, batch_size: int = 8) -> dict:
    """Mean next-token loss over the assistant reply tokens of the rows (token-weighted), and each row's own
    (`row_nll`: its reply's mean NLL, NaN for a row with no reply token) for paired comparisons of two models."""
    if not rows:
        return {"eval_loss": float("nan"), "perplexity": float("nan"), "eval_tokens": 0, "row_nll": []}
    scored = reply_logprobs(model, tokenizer, rows, max_len, batch_size)
    count = sum(n for _, n in scored)
    mean_loss = -sum(logp for logp, _ in scored) / max(1, count)
    row_nll = [-logp / n if n else float("nan") for logp, n in scored]
    return {
        "eval_loss": mean_loss,
        "perplexity": math.exp(min(mean_loss, 50)),
        "eval_tokens": count,
        "row_nll": row_nll,
    }
