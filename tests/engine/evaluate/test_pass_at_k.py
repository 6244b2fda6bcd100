"""pass@k (engine/evaluate/pass_at_k.py): the unbiased estimator against hand-computed cases, the rates over
prompts, and the sign test and its verdict on right counts before and after."""

import math

import pytest

from dragon_dagster.engine.evaluate.pass_at_k import compare, pass_at_k


def test_the_estimator_against_hand_computed_cases():
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(5, 2, 1) == pytest.approx(2 / 5)  # pass@1 is the share right
    assert pass_at_k(8, 1, 4) == pytest.approx(1 - 35 / 70)  # 1 - C(7,4)/C(8,4)
    assert pass_at_k(4, 0, 2) == 0.0 and pass_at_k(4, 4, 1) == 1.0
    assert pass_at_k(5, 4, 2) == 1.0  # fewer wrong samples than tries: a right one is always drawn
    with pytest.raises(ValueError, match="needs 0 <= c <= n and 1 <= k <= n"):
        pass_at_k(4, 1, 5)


def test_rates_average_the_estimator_over_prompts_and_the_sign_test_counts_prompts():
    (change,) = compare({"numeric": [0, 1, 2]}, {"numeric": [0, 2, 4]}, 4, 2, 0.7, "grpo", "start")
    assert change.pass1_before == pytest.approx((0 + 0.25 + 0.5) / 3)
    assert change.pass1_after == pytest.approx((0 + 0.5 + 1) / 3)
    assert change.passk_after == pytest.approx((0 + (1 - 1 / 6) + 1) / 3)  # 1 - C(2,2)/C(4,2)
    assert change.passk_before == pytest.approx((0 + 0.5 + (1 - 1 / 6)) / 3)  # 1 - C(3,2)/C(4,2) = 1/2
    assert (change.prompts, change.samples, change.k, change.temperature) == (3, 4, 2, 0.7)
    assert (change.prompts_up, change.prompts_down, change.verdict) == (2, 0, "no measurable change")  # p = 0.5
    assert change.figures("after") == {"pass_at_1_numeric": change.pass1_after, "pass_at_2_numeric": change.passk_after}
    assert change.compared_with() == "its start"


@pytest.mark.parametrize(
    "before, after, verdict",
    [
        ([0, 1, 2, 3, 0, 0, 0, 0, 0], [1, 2, 3, 4, 1, 1, 1, 1, 0], "better"),  # 8 up, none down: p = 2/2^8
        ([1, 2, 3, 4, 1, 1, 1, 1, 0], [0, 1, 2, 3, 0, 0, 0, 0, 0], "worse"),
        ([0, 1, 2, 3, 0, 0, 0, 0, 0], [1, 0, 3, 2, 1, 0, 1, 0, 0], "no measurable change"),  # 4 up, 3 down
    ],
)
def test_the_verdict_is_the_exact_sign_test_over_the_prompts_that_moved(before, after, verdict):
    (change,) = compare({"numeric": before}, {"numeric": after}, 4, 4, 1.0, "merged", "base")
    assert change.verdict == verdict
    up, down = change.prompts_up, change.prompts_down
    assert change.p_value == pytest.approx(
        2 * sum(math.comb(up + down, i) for i in range(min(up, down) + 1)) / 2 ** (up + down), rel=1e-3
    )
