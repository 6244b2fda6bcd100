"""pass@k (engine/evaluate/pass_at_k.py): the unbiased estimator against hand-computed cases, the rates over
prompts, and the sign test on right counts before and after."""

import pytest

from dragon_dagster.engine.evaluate.pass_at_k import pass_at_k, pass_rates, sign_test


def test_the_estimator_against_hand_computed_cases():
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(5, 2, 1) == pytest.approx(2 / 5)  # pass@1 is the share right
    assert pass_at_k(8, 1, 4) == pytest.approx(1 - 35 / 70)  # 1 - C(7,4)/C(8,4)
    assert pass_at_k(4, 0, 2) == 0.0 and pass_at_k(4, 4, 1) == 1.0
    assert pass_at_k(5, 4, 2) == 1.0  # fewer wrong samples than tries: a right one is always drawn
    with pytest.raises(ValueError, match="needs 0 <= c <= n and 1 <= k <= n"):
        pass_at_k(4, 1, 5)


def test_rates_average_the_estimator_over_prompts_and_the_sign_test_counts_prompts():
    rates = pass_rates({"numeric": [0, 2, 4]}, n=4, k=2)
    assert rates["numeric"]["pass@1"] == pytest.approx((0 + 0.5 + 1) / 3)
    assert rates["numeric"]["pass@2"] == pytest.approx((0 + (1 - 1 / 6) + 1) / 3)  # 1 - C(2,2)/C(4,2)
    change = sign_test([0, 1, 2, 3, 0, 0, 0, 0, 0], [1, 2, 3, 4, 1, 1, 1, 1, 0])
    assert change["prompts_up"] == 8 and change["prompts_down"] == 0
    assert change["p_value"] == pytest.approx(2 / 2**8, rel=1e-3)  # rounded to 4 significant digits
