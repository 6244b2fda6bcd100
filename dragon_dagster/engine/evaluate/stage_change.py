"""Whether a stage helped: its model against the model before it on the same held-out rows, row by row.

Each row's reply NLL (mean over its reply tokens) before and after the stage is a pair; the Wilcoxon signed-rank
test (scipy) on the pairs says whether the change is more than noise, with no assumption that the differences are
normal (a few rows often move a lot). The verdict is plain words: "better" or "worse" when the test finds a change
at ALPHA ("better, by under 1%" when the change is that small), else "no measurable change" (which, on a few
rows, is not proof of none). A stage that did not move its model (every row within ROUNDING) is "no measurable
change" with p = 1.
"""

from __future__ import annotations

import math
import warnings

ALPHA = 0.05  # the two-sided level at which a change counts as measured
SMALL = 0.01  # a measured change under this share of the NLL before it is said to be small: every row can move
# together by a hair (a DPO stage at a low learning rate), which the test finds and nobody would call an improvement
TEST = "Wilcoxon signed-rank, two-sided, on per-row reply NLL"
ROUNDING = 1e-6  # nats per token: a row's NLL moving less than this is float rounding (the same weights loaded
# another way, batched another way), not a change, however consistent its sign


def sign_test_p(up: int, down: int) -> float:
    """The exact two-sided sign test's p-value on paired outcomes that moved one way (up) or the other (down),
    ties dropped: binomial with p = 1/2 (McNemar's exact test is this on the discordant pairs)."""
    n, low = up + down, min(up, down)
    return 1.0 if n == 0 else min(1.0, 2 * sum(math.comb(n, i) for i in range(low + 1)) / 2**n)


def sign_verdict(up: int, down: int, alpha: float = ALPHA) -> tuple[float, str]:
    """The sign test's p-value on outcomes that rose (up) or fell (down), and the verdict in plain words."""
    p = sign_test_p(up, down)
    if p >= alpha:
        return p, "no measurable change"
    return p, "better" if up > down else "worse"


def paired_change(before: list[float], after: list[float], alpha: float = ALPHA) -> dict:
    """The change from `before` to `after` (per-row NLLs of the same rows; lower is better): rows compared, the
    mean NLL of each, their mean difference (after - before), the test's p-value and the verdict."""
    pairs = [(b, a) for b, a in zip(before, after, strict=True) if math.isfinite(b) and math.isfinite(a)]
    out = {"rows": len(pairs), "test": TEST}
    if not pairs:
        return {
            **out,
            "mean_before": None,
            "mean_after": None,
            "mean_difference": None,
            "p_value": None,
            "verdict": "not measured (no row has a reply to score)",
        }
    differences = [a - b if abs(a - b) > ROUNDING else 0.0 for b, a in pairs]
    out.update(
        mean_before=sum(b for b, _ in pairs) / len(pairs),
        mean_after=sum(a for _, a in pairs) / len(pairs),
        mean_difference=sum(differences) / len(differences),
    )
    if all(d == 0 for d in differences):
        return {**out, "p_value": 1.0, "verdict": "no measurable change"}
    from scipy.stats import wilcoxon

    with warnings.catch_warnings():  # one nonzero difference: scipy divides by a zero spread, and says so
        warnings.simplefilter("ignore", RuntimeWarning)
        p = float(wilcoxon(differences, zero_method="zsplit").pvalue)
    if not math.isfinite(p):
        p = 1.0
    verdict = "no measurable change"
    if p < alpha:
        verdict = "better" if out["mean_difference"] < 0 else "worse"
        if abs(out["mean_difference"]) < SMALL * abs(out["mean_before"]):
            verdict += f", by under {SMALL:.0%}"
    return {**out, "p_value": float(f"{p:.4g}"), "verdict": verdict}


def stage_changes(models: list[dict]) -> list[dict]:
    """For each stage after the first model (base): its change against the model before it. models: the report's
    stage_nll entries in chain order, each with its `row_nll` ([{"model", "stage"?, "row_nll": [...]}])."""
    out = []
    for before, after in zip(models, models[1:]):
        change = paired_change(before["row_nll"], after["row_nll"])
        out.append({"stage": after.get("stage", after["model"]), "against": before["model"], **change})
    return out
