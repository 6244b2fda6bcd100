"""Per-version live liked rates from feedback records, and the live gate's one-sided Fisher exact test (issue 60)."""

from math import comb

import pytest

from dragon_dagster.engine.data.feedback.sqlite import SQLiteFeedbackStore
from dragon_dagster.engine.evaluate.live_rates import challenger_worse_p, live_decision, live_rates


def rated(store: SQLiteFeedbackStore, model: str, verdict: str) -> int:
    return store.record(
        "c", [{"role": "user", "content": "hi"}], "hello", verdict, edited="better" if verdict == "edit" else None,
        model=model,
    )  # fmt: skip


def test_rates_count_up_as_liked_and_down_or_edit_as_not_per_version_of_the_name(tmp_path):
    store = SQLiteFeedbackStore(tmp_path / "support.sqlite")
    for model, verdict in [
        ("models:/support/1", "up"),
        ("models:/support/2", "down"),
        ("models:/support/1", "edit"),
        ("models:/support/2", "up"),
        ("models:/support/1", "up"),
        ("models:/other/1", "up"),  # another registered model
        ("models:/support@champion (version 1)", "up"),  # the chat page's: not a version's rating over HTTP
        ("/some/model/dir", "down"),
    ]:
        rated(store, model, verdict)
    records = store.ratings()
    assert [r["id"] for r in records] == list(range(1, 9)) and records == [
        {k: r[k] for k in ("id", "model", "verdict", "created")} for r in store.records()
    ]
    assert live_rates(records, "support") == {"1": (2, 3), "2": (1, 2)}
    assert live_rates(records, "support", after_id=2) == {"1": (1, 2), "2": (1, 1)}
    assert live_rates(records, "support", first=1) == {"1": (1, 1), "2": (0, 1)}
    assert live_rates(store.ratings(after_id=8), "support") == {}


def hypergeometric_lower_tail(a: int, n: int, c: int, m: int) -> float:
    """P(X <= a): X the challenger's likes when a + c likes fall at random among its n and the champion's m."""
    likes = a + c
    return sum(comb(n, k) * comb(m, likes - k) for k in range(max(0, likes - m), a + 1)) / comb(n + m, likes)


@pytest.mark.parametrize("a,n,c,m", [(3, 10, 8, 10), (8, 10, 3, 10), (0, 8, 8, 8), (5, 20, 5, 12), (0, 1, 0, 1)])
def test_the_p_value_is_fishers_one_sided_lower_tail(a, n, c, m):
    assert challenger_worse_p((a, n), (c, m)) == pytest.approx(hypergeometric_lower_tail(a, n, c, m), rel=1e-9)


def test_the_decision_waits_for_min_ratings_then_tests_only_the_first_of_each():
    def records(challenger: list[str], champion: list[str]) -> list[dict]:
        out = [("models:/s/2", v) for v in challenger] + [("models:/s/1", v) for v in champion]
        return [{"id": i + 1, "model": m, "verdict": v} for i, (m, v) in enumerate(out)]

    waiting = live_decision(records(["up"] * 3, ["up"] * 5), "s", "2", "1", min_ratings=4, alpha=0.05)
    assert (
        waiting.promote is None
        and waiting.challenger == (3, 3)
        and "has 3 and s/1 (champion) 4 of the 4 each needs" in waiting.reason
    )
    worse = live_decision(records(["down"] * 8, ["up"] * 8), "s", "2", "1", min_ratings=8, alpha=0.05)
    assert worse.promote is False and worse.p_value == pytest.approx(1 / comb(16, 8))
    assert worse.reason.startswith("refused: s/2 liked 0/8 against s/1's 8/8: one-sided Fisher exact p = ")
    better = live_decision(records(["up"] * 8, ["down"] * 8), "s", "2", "1", min_ratings=8, alpha=0.05)
    assert better.promote is True and better.p_value == pytest.approx(1.0)
    # ratings past the first min_ratings of a version do not enter the test
    late = live_decision(records(["up"] * 8 + ["down"] * 30, ["up"] * 8), "s", "2", "1", min_ratings=8, alpha=0.05)
    assert late.promote is True and late.challenger == (8, 8)
    # nor do those before after_id (when the challenger started waiting)
    assert live_decision(records(["down"] * 8, ["up"] * 8), "s", "2", "1", 8, 0.05, after_id=8).promote is None
