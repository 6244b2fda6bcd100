"""What the feedback tests share: crafted records (as a store returns them), a chat's tool turns, and a writer
process that records until it is killed."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]  # the repository: a child process imports dragon_dagster from it


def turns(*texts: str) -> list[dict]:
    roles = ["user", "assistant"]
    return [{"role": roles[i % 2], "content": t} for i, t in enumerate(texts)]


def record(i, conversation, history, reply, verdict, edited=None):
    return {
        "id": i,
        "conversation_id": conversation,
        "turns": history,
        "reply": reply,
        "verdict": verdict,
        "edited": edited,
        "model": "m",
        "created": "2026-01-01T00:00:00+00:00",
    }


P1, P2, P3 = turns("reset my password?"), turns("hi", "hello", "refund?"), turns("lonely prompt")
CRAFTED = [
    record(1, "a", P1, "Click 'forgot password'.", "up"),
    record(2, "b", P1, "No idea.", "down"),
    record(3, "c", P2, "Refunds take 5 days.", "edit", edited="Refunds take 5 business days."),
    record(4, "d", P3, "meh", "down"),  # a bad reply with no good one: no pair
    record(5, "e", P1, "Click 'forgot password'.", "up"),  # duplicate of 1
    record(6, "f", P3, "changed my mind", "up"),
    record(7, "f", P3, "changed my mind", "down"),  # same reply, same conversation: the later vote wins
]


CALL = {"type": "function", "function": {"name": "order_status", "arguments": {"order_id": "A1042"}}}
TOOL_TURNS = [
    {"role": "system", "content": "Look orders up."},
    {"role": "user", "content": "Where is A1042?"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "name": "order_status", "content": '{"status": "shipped"}'},
]


# A chat server's writes, each acknowledged (its id printed) once record() returned: the store arrives pickled
WRITER = """
import pickle, sys
store = pickle.loads(bytes.fromhex(sys.argv[1]))
for i in range(100000):
    fid = store.record("kill", [{"role": "user", "content": f"q{i}"}], "r" * 20000, "up")
    print(fid, flush=True)
"""


def spawn_writer(store) -> subprocess.Popen:
    """A process recording into (a copy of) `store` until it is killed, printing each acknowledged id."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, pickle.dumps(store).hex()], stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT
    )


def acknowledged(proc: subprocess.Popen, n: int, timeout: float = 60) -> list[int]:
    """The next `n` ids the writer acknowledged (fewer if it stopped or `timeout` passed)."""
    printed, deadline = [], time.monotonic() + timeout
    while len(printed) < n and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        printed.append(int(line))
    return printed
