"""Conversations in which the model's tool calls are run: the loop that evaluation and a tool GRPO stage's
before/after scoring drive (TRL's GRPOTrainer drives its own while training; chat, infer/chat.py, streams its
own with the same turns: `call_turn`, `run_call`, shown as `turn_lines`).

Each turn the model replies; a reply that calls tools (tools/calls.py reads the fallback format's <tool_call>
blocks, which a native template's parser would give as tool_calls too) becomes an assistant turn with those
calls, each call is run by the Toolset (a timeout, no shell; an error is an answer, never an exception) and its
result appended as a tool turn, and the model replies again, until it answers without a call or the
conversation has made `max_calls` calls (the last reply is then kept as it is).
"""

from __future__ import annotations

import json

from ..tools.calls import ToolCall, parse_calls
from ..tools.declare import Toolset
from .generation import generate

RESULT_INDENT = "   "  # a result's line starts under the tool's name of the call line above it ("-> ")


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
            produced[i].append(call_turn(text, calls))
            produced[i] += [run_call(toolset, call) for call in calls]
            made[i] += len(calls)
            still.append(i)
        active = still
    return produced


def call_turn(text: str, calls: list[ToolCall]) -> dict:
    """The assistant turn that makes `calls` (its text: what the reply said outside the call blocks)."""
    return {"role": "assistant", "content": text, "tool_calls": [c.as_message_call() for c in calls]}


def run_call(toolset: Toolset, call: ToolCall) -> dict:
    """The tool turn that answers one call: the toolset runs it (never raising: an error is its answer)."""
    result = toolset.call(call.name, call.arguments)
    return {"role": "tool", "name": call.name, "content": result.content}


def turn_lines(turn: dict) -> list[str]:
    """How a tool turn reads in a transcript or a terminal chat: `-> name({"arg": ...})` per call of an assistant
    turn (not its text), `   = result` for a tool turn; nothing for other turns."""
    if turn.get("role") == "tool":
        return [f"{RESULT_INDENT}= {turn.get('content', '')}"]
    lines = []
    for call in turn.get("tool_calls") or []:
        function = call.get("function", call)
        lines.append(f"-> {function.get('name')}({json.dumps(function.get('arguments'), ensure_ascii=False)})")
    return lines


def final_answer(turns: list[dict]) -> str:
    """The text of a conversation's last assistant turn ("" when there is none)."""
    return next((t.get("content") or "" for t in reversed(turns) if t.get("role") == "assistant"), "")


def transcript(turns: list[dict]) -> str:
    """A conversation's new turns as one readable text (samples, reports): each call with its result, then the
    answer."""
    lines = []
    for turn in turns:
        if turn.get("role") != "tool" and turn.get("content"):
            lines.append(turn["content"])
        lines += turn_lines(turn)
    return "\n".join(lines)
