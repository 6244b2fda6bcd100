"""The report's tool-use cases and the paired test, on plain data."""

from __future__ import annotations

import math

from dragon_dagster.engine.evaluate.tool_use import mcnemar, tool_cases

CALL = {"type": "function", "function": {"name": "order_status", "arguments": {"order_id": "A1042"}}}


def test_a_case_is_the_question_before_the_first_call_its_call_and_the_final_answer():
    row = {
        "prompt": [
            {"role": "system", "content": "Help."},
            {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": "Hi!"},
            {"role": "user", "content": "Where is A1042?"},
            {"role": "assistant", "content": "", "tool_calls": [CALL]},
            {"role": "tool", "name": "order_status", "content": '{"status": "shipped"}'},
        ],
        "completion": [{"role": "assistant", "content": "It shipped."}],
    }
    plain = {"prompt": [{"role": "user", "content": "Hi"}], "completion": [{"role": "assistant", "content": "Hey"}]}
    [case] = tool_cases([plain, row])
    assert [t["content"] for t in case["prompt"]] == ["Help.", "Hello", "Hi!", "Where is A1042?"]
    assert case["call"].name == "order_status" and case["call"].arguments == {"order_id": "A1042"}
    assert case["answer"] == "It shipped."


def test_mcnemar_counts_the_discordant_pairs_and_gives_the_exact_two_sided_p():
    base = [0, 0, 0, 0, 0, 0, 1, 1]
    merged = [1, 1, 1, 1, 1, 1, 1, 0]
    result = mcnemar(base, merged)
    assert (result["only_base"], result["only_merged"], result["cases"]) == (1, 6, 8)
    # 7 discordant pairs, 1 against: 2 * (C(7,0) + C(7,1)) / 2^7
    assert math.isclose(result["p_value"], 2 * (1 + 7) / 128, rel_tol=1e-6)
    assert mcnemar([1, 0], [1, 0])["p_value"] == 1.0  # no discordant pair: no evidence either way
    assert mcnemar([0] * 12, [1] * 12)["p_value"] < 0.001
