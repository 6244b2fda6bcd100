"""Write the orders pipeline's data deterministically: `python -m dragon_dagster.example_data.make_order_data`.

orders_traces.jsonl     300 support conversations (OpenAI `messages` layout) in which the assistant looks an order
                        up with the order_status tool and answers from its result; a sixth of them start with a
                        greeting exchange, so the conversation has several assistant turns
orders_questions.csv    200 customer questions (question, order_id, answer) for the GRPO stage: the reference is
                        the answer the tool's result supports

The tool is the pipeline's own (defs/orders/tools.py), so the traces hold what the tool really returns.
"""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

from ..defs.orders.tools import order_status

HERE = Path(__file__).parent
TRACES, TRACES_SEED = 300, 7
SYSTEM = "You are the support assistant of an online shop. Look orders up with your tool before answering."
QUESTIONS = [
    "Where is my order {id}?",
    "Hi, can you check order {id} for me?",
    "What's the status of {id}?",
    "Has order {id} shipped yet?",
    "I ordered something last week, the number is {id}. Any news?",
    "When will {id} arrive?",
    "Could you look up my order? It's {id}.",
    "Is {id} on its way?",
]
GREETINGS = [("Hello!", "Hello! How can I help you today?"), ("Hi there", "Hi! What can I do for you?")]


def order_ids(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    ids: list[str] = []
    while len(ids) < n:
        candidate = f"{rng.choice('ABCDEFGH')}{rng.randrange(1000, 10000)}"
        if candidate not in ids:
            ids.append(candidate)
    return ids


def answer(record: dict) -> str:
    """The reply a good agent writes from the tool's result."""
    status, order = record["status"], record["order_id"]
    if status == "delivered":
        return f"Order {order} has been delivered."
    if status == "processing":
        return f"Order {order} is still being processed; it should arrive on {record['arrives']}."
    return f"Order {order} is {status} and should arrive on {record['arrives']}."


def trace(order: str, rng: random.Random) -> dict:
    result = order_status(order)
    call = {"type": "function", "function": {"name": "order_status", "arguments": {"order_id": order}}}
    messages = [{"role": "system", "content": SYSTEM}]
    if rng.random() < 1 / 6:
        hello, reply = rng.choice(GREETINGS)
        messages += [{"role": "user", "content": hello}, {"role": "assistant", "content": reply}]
    messages += [
        {"role": "user", "content": rng.choice(QUESTIONS).format(id=order)},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": "order_status", "content": result},
        {"role": "assistant", "content": answer(json.loads(result))},
    ]
    return {"messages": messages}


def traces(n: int = TRACES, seed: int = TRACES_SEED) -> list[dict]:
    rng = random.Random(seed)
    return [trace(order, rng) for order in order_ids(n, seed)]


def questions(n: int = 200, seed: int = 11) -> list[dict]:
    rng = random.Random(seed)
    seen = set(order_ids(TRACES, TRACES_SEED))  # the questions ask about orders that training never showed
    rows = []
    for order in order_ids(n * 2, seed):
        if order in seen:
            continue
        reply = answer(json.loads(order_status(order)))
        rows.append({"question": rng.choice(QUESTIONS).format(id=order), "order_id": order, "answer": reply})
        if len(rows) == n:
            break
    return rows


if __name__ == "__main__":
    with (HERE / "orders_traces.jsonl").open("w", encoding="utf-8") as f:
        for row in traces():
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    with (HERE / "orders_questions.csv").open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=["question", "order_id", "answer"])
        writer.writeheader()
        writer.writerows(questions())
    print("wrote orders_traces.jsonl and orders_questions.csv")
