"""pass@k on prompt data: n completions sampled per prompt at the stage's temperature, each accuracy-like reward's
share of prompts answered right at least once in k tries (Chen et al. 2021's unbiased estimator over the n), and
pass@1 beside it; a model before and after training compared prompt by prompt with a sign test.

Greedy accuracy says what the model answers most likely; pass@k says what it can reach by sampling, which is what
reinforcement learning sharpens (pass@1 rising towards pass@k) or narrows (pass@k falling while pass@1 rises).
"""

from __future__ import annotations

import math
from statistics import mean

from ..config.results import PassAtK
from ..infer.generation import generate
from ..rewards import ACCURACY_TYPES, RewardSet
from .stage_change import sign_verdict


def pass_at_k(n: int, c: int, k: int) -> float:
    """The chance that k of n samples, drawn without replacement, hold at least one of the c right ones:
    1 - C(n-c, k) / C(n, k), as a product so large n stay exact enough."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1 - k / i for i in range(n - c + 1, n + 1))


def right_counts(
    model, tokenizer, rows: list[dict], rewards: RewardSet, n: int, temperature: float, max_new_tokens: int, seed: int
) -> dict[str, list[int]]:
    """Per accuracy-like reward, how many of n sampled completions of each row scored 1."""
    accuracy = [r.name for r in rewards if r.type in ACCURACY_TYPES]
    if not accuracy or not rows or n < 1:
        return {}
    prompts = [r["prompt"] for r in rows for _ in range(n)]
    completions = generate(
        model, tokenizer, prompts, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, batch_size=16
    )
    repeated = [r for r in rows for _ in range(n)]
    scores = rewards.score(completions, repeated, on_error="zero").scores
    return {
        name: [sum(s >= 1.0 - 1e-9 for s in scores[name][i * n : (i + 1) * n]) for i in range(len(rows))]
        for name in accuracy
    }


def compare(
    before: dict[str, list[int]],
    after: dict[str, list[int]],
    samples: int,
    k: int,
    temperature: float,
    model: str,
    against: str,
) -> list[PassAtK]:
    """Each accuracy-like reward's pass@1 and pass@k, `model` against `against`, from right_counts of the same
    prompts (before: against's, after: model's), with the sign test over the prompts whose right count moved."""
    out = []
    for reward, counts in after.items():
        was = before[reward]
        up = sum(a > b for b, a in zip(was, counts, strict=True))
        down = sum(a < b for b, a in zip(was, counts, strict=True))
        p, verdict = sign_verdict(up, down)
        out.append(
            PassAtK(
                reward=reward,
                model=model,
                against=against,
                prompts=len(counts),
                samples=samples,
                k=k,
                temperature=temperature,
                pass1_before=mean(pass_at_k(samples, c, 1) for c in was),
                pass1_after=mean(pass_at_k(samples, c, 1) for c in counts),
                passk_before=mean(pass_at_k(samples, c, k) for c in was),
                passk_after=mean(pass_at_k(samples, c, k) for c in counts),
                prompts_up=up,
                prompts_down=down,
                p_value=float(f"{p:.4g}"),
                verdict=verdict,
            )
        )
    return out
