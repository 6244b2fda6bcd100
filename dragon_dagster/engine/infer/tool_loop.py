"""Conversations in which the model's tool calls are run: the loop that evaluation, a tool GRPO stage's
before/after scoring and chat drive (TRL's GRPOTrainer drives its own while training).

Each turn the model replies; a reply that calls tools (tools/calls.py reads the fallback format's <tool_call>
blocks, which a native template's parser would give as tool_calls too) becomes an assistant turn with those
calls, each call is run by the Toolset (a timeout, no shell; an error is an answer, never an exception) and its
result appended as a tool turn, and the model replies again, until it answers without a call or the
conversation has made `max_calls` calls (the last reply is then kept as it is).
"""

from __future__ import annotations

import json

from ..tools.calls import parse_calls
from ..tools.declare import Toolset
from .generation import generate


def converse(
    model,
    tokenizer,
    prompts: list[list[dict]],
    toolset: Toolset,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    batch_size: int = 8,
) -> list[list[dict]]:
    """Each prompt's new turns (assistant turns with their tool_calls, tool turns, the final assistant answer)."""
    produced: list[list[dict]] = [[] for _ in prompts]
    made = [0] * len(prompts)
    active = list(range(len(prompts)))
    while active:
        replies = generate(
            model,
            tokenizer,
            [list(prompts[i]) + produced[i] for i in active],
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            batch_size=batch_size,
            tools=toolset.schemas,
        )
        still = []
        for i, reply in zip(active, replies):
            text, calls, _ = parse_calls(reply)
            room = toolset.max_calls - made[i]
            if not calls or room <= 0:
                produced[i].append({"role": "assistant", "content": reply})
                continue
            calls = calls[:room]
            produced[i].append(
                {
                    "role": "assistant",
                    "content": text,
                    "tool_calls": [
                        {"type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls
                    ],
                }
            )
            for call in calls:
                result = toolset.call(call.name, call.arguments)
                produced[i].append({"role": "tool", "name": call.name, "content": result.content})
            made[i] += len(calls)
            still.append(i)
        active = still
    return produced


def final_answer(turns: list[dict]) -> str:
    """The text of a conversation's last assistant turn ("" when there is none)."""
    return next((t.get("content") or "" for t in reversed(turns) if t.get("role") == "assistant"), "")


def transcript(turns: list[dict]) -> str:
    """A conversation's new turns as one readable text (samples, reports): each call with its result, then the
    answer."""
    lines = []
    for turn in turns:
        if turn.get("role") == "tool":
            lines.append(f"  = {turn.get('content', '')}")
            continue
        if turn.get("content"):
            lines.append(turn["content"])
        for call in turn.get("tool_calls") or []:
            function = call.get("function", call)
            lines.append(f"-> {function.get('name')}({json.dumps(function.get('arguments'), ensure_ascii=False)})")
    return "\n".join(lines)
