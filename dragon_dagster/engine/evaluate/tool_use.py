"""How well a model uses the pipeline's tools on held-out conversations: the report's tool figures, base against
merged, and the paired test that says whether the difference is more than chance.

A held-out conversation tests tool use when one of its assistant turns calls a tool. Its case is the turns
before that call (the question), the call it makes (the reference) and its last assistant turn (the answer).
Per case:
- the model's first reply to the question (the tools rendered by the chat template) is scored for a valid call
  (tools/metrics.py: JSON, a declared tool, arguments the schema accepts), the right tool, and the arguments
  matching the reference's (the share of keys with equal values); `call_correct` is right tool and all
  arguments equal; a reply that calls no tool scores 0 on each;
- the whole conversation then runs (infer/tool_loop.py: the calls are executed, their results appended, the
  model goes on) and its final answer is compared with the reference answer (exact, token_f1).
"""

from __future__ import annotations

from statistics import mean

from ..infer.generation import generate
from ..infer.tool_loop import converse, final_answer
from ..text.matchers import exact, token_f1
from ..tools.declare import Toolset
from ..tools.metrics import expected_call, tool_arguments_match, tool_call_valid, tool_name_match
from .stage_change import sign_test_p


def tool_cases(rows: list[dict]) -> list[dict]:
    """The held-out conversations that call a tool, as cases: {"prompt", "call", "answer"}."""
    cases = []
    for row in rows:
        turns = list(row.get("prompt") or []) + list(row.get("completion") or [])
        call = expected_call(turns)
        if call is None:
            continue
        at = next(i for i, t in enumerate(turns) if t.get("role") == "assistant" and _calls(t))
        cases.append({"prompt": turns[:at], "call": call, "answer": final_answer(turns)})
    return cases


def _calls(turn: dict) -> bool:
    return bool(turn.get("tool_calls")) or "<tool_call>" in (turn.get("content") or "")


def measure(model, tokenizer, cases: list[dict], toolset: Toolset, max_new_tokens: int) -> dict:
    """The tool figures of one model over the cases: means, and each case's outcome for the paired test."""
    prompts = [c["prompt"] for c in cases]
    first = generate(model, tokenizer, prompts, max_new_tokens=max_new_tokens, tools=toolset.schemas)
    valid = [tool_call_valid(r, toolset.schemas) or 0.0 for r in first]
    right_tool = [tool_name_match(r, c["call"]) or 0.0 for r, c in zip(first, cases)]
    arguments = [tool_arguments_match(r, c["call"]) or 0.0 for r, c in zip(first, cases)]
    correct = [float(t == 1.0 and a == 1.0) for t, a in zip(right_tool, arguments)]
    conversations = converse(model, tokenizer, prompts, toolset, max_new_tokens=max_new_tokens)
    answers = [final_answer(turns) for turns in conversations]
    return {
        "figures": {
            "conversations": len(cases),
            "tool_call_valid": _mean(valid),
            "right_tool": _mean(right_tool),
            "arguments_match": _mean(arguments),
            "call_correct": _mean(correct),
            "answer_exact": _mean([exact(a, c["answer"]) for a, c in zip(answers, cases)]),
            "answer_token_f1": _mean([token_f1(a, c["answer"]) for a, c in zip(answers, cases)]),
        },
        "call_correct": correct,
        "samples": [{"first_reply": r, "answer": a} for r, a in zip(first, answers)],
    }


def _mean(values: list[float]) -> float:
    return round(mean(values), 4) if values else float("nan")


def mcnemar(before: list[float], after: list[float]) -> dict:
    """McNemar's exact test on paired right/wrong outcomes: the cases only one side got right decide it.
    Returns the counts and the two-sided p-value (binomial with p = 1/2 on the discordant pairs)."""
    only_before = sum(1 for b, a in zip(before, after) if b and not a)
    only_after = sum(1 for b, a in zip(before, after) if a and not b)
    p = sign_test_p(only_after, only_before)
    return {"cases": len(before), "only_base": only_before, "only_merged": only_after, "p_value": float(f"{p:.4g}")}
