"""How far the student is from the teacher where it matters on-policy: over the student's own replies, the
generalized Jensen-Shannon divergence of the two next-token distributions at each reply token (the objective
TRL's DistillationTrainer minimizes, at the stage's beta and temperature), averaged over the tokens."""

from __future__ import annotations

from ...infer.logprobs import encode_reply


def generalized_jsd(student_logits, teacher_logits, beta: float, temperature: float = 1.0):
    """Per position: beta 0 the forward KL(teacher || student), 1 the reverse KL(student || teacher), between
    them the divergence of each from the mixture (1 - beta) student + beta teacher, weighted as TRL weighs them."""
    import math

    import torch
    import torch.nn.functional as F

    student = F.log_softmax(student_logits.float() / temperature, dim=-1)
    teacher = F.log_softmax(teacher_logits.float() / temperature, dim=-1)
    if beta == 0:
        return F.kl_div(student, teacher, reduction="none", log_target=True).sum(-1)
    if beta == 1:
        return F.kl_div(teacher, student, reduction="none", log_target=True).sum(-1)
    mixture = torch.logsumexp(torch.stack([student + math.log1p(-beta), teacher + math.log(beta)]), dim=0)
    to_teacher = F.kl_div(mixture, teacher, reduction="none", log_target=True).sum(-1)
    to_student = F.kl_div(mixture, student, reduction="none", log_target=True).sum(-1)
    return beta * to_teacher + (1 - beta) * to_student


def mean_divergence(
    student,
    teacher,
    tokenizer,
    prompts: list[list[dict]],
    replies: list[str],
    beta: float,
    temperature: float = 1.0,
    max_len: int = 1024,
) -> float:
    """The mean per-token divergence over the reply tokens of each prompt's reply (NaN when there are none)."""
    import torch

    device = next(student.parameters()).device
    total, count = 0.0, 0
    for prompt, reply in zip(prompts, replies):
        row = {"prompt": prompt, "completion": [{"role": "assistant", "content": reply}]}
        ids, n_prompt = encode_reply(tokenizer, row, max_len)
        if len(ids) <= n_prompt:
            continue
        input_ids = torch.tensor([ids], device=device)
        at_reply = slice(n_prompt - 1, len(ids) - 1)  # the positions that predict the reply's tokens
        with torch.no_grad():
            ours = student(input_ids=input_ids).logits[0, at_reply]
            theirs = teacher(input_ids=input_ids.to(next(teacher.parameters()).device)).logits[0, at_reply]
        per_token = generalized_jsd(ours, theirs.to(ours.device), beta, temperature)
        total += float(per_token.sum())
        count += per_token.numel()
    return total / count if count else float("nan")
