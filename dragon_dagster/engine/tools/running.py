"""How one tool call runs: a Python tool in a forked child process killed at its time limit, a command tool's argv
with its JSON arguments on stdin (engine/commands.py); each answers (status, text), never raising.

Each Python tool call runs in a forked child process (multiprocessing's "fork"
context; the child starts its own session and writes its result over a pipe, its stdout goes to /dev/null so
prints cannot mix into the worker's protocol lines). On timeout the parent kills the child's whole process
group. A thread cannot be killed and SIGALRM only interrupts the main thread between bytecodes, so only a process
gives a real limit; "fork" rather than "spawn" because the child inherits the function loaded from the file (no
pickling, no re-import) and starts in milliseconds. The child runs only the tool: it must not use CUDA or locks
that other threads of the worker held at the fork. Where fork does not exist (Windows) a call runs in a daemon
thread whose result is abandoned on timeout: that fallback cannot stop a tool that hangs or ends the process.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import threading
from collections.abc import Callable, Sequence
from typing import Any

from ..commands import run_command


def run_function(function: Callable, arguments: dict[str, Any], timeout: float) -> tuple[str, str]:
    """(status, text): run function(**arguments) in a forked child, killed after timeout seconds."""
    if "fork" not in multiprocessing.get_all_start_methods():
        return run_in_thread(function, arguments, timeout)
    context = multiprocessing.get_context("fork")
    reader, writer = context.Pipe(duplex=False)
    child = context.Process(target=_child, args=(function, arguments, writer), daemon=True)
    child.start()
    writer.close()
    try:
        if not reader.poll(timeout):
            return "timeout", ""
        try:
            return reader.recv()
        except (EOFError, OSError):
            child.join(timeout=1)
            return "error", f"the tool's process ended without an answer (exit code {child.exitcode})"
    finally:
        _kill(child.pid)
        child.join()
        reader.close()


def _child(function: Callable, arguments: dict[str, Any], writer) -> None:
    os.setsid()  # its own process group: a timeout also ends whatever the tool started
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # the result is the return value; prints must not reach the worker's stdout
    try:
        answer = ("ok", as_text(function(**arguments)))
    except BaseException as e:  # noqa: BLE001 - whatever the tool raises is its answer
        answer = ("error", f"{type(e).__name__}: {e}")
    writer.send(answer)
    writer.close()


def _kill(pid: int | None) -> None:
    """End the child's process group, and the child itself in case it had not yet started its own group."""
    if pid is None:
        return
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except OSError:
            pass  # already gone


def run_in_thread(function: Callable, arguments: dict[str, Any], timeout: float) -> tuple[str, str]:
    answer: list[tuple[str, str]] = []

    def run():
        try:
            answer.append(("ok", as_text(function(**arguments))))
        except BaseException as e:  # noqa: BLE001
            answer.append(("error", f"{type(e).__name__}: {e}"))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    return answer[0] if answer else ("timeout", "")


def run_tool_command(argv: Sequence[str], arguments: dict[str, Any], timeout: float) -> tuple[str, str]:
    try:
        code, stdout = run_command(argv, json.dumps(arguments).encode("utf-8"), timeout)
    except OSError as e:
        return "error", f"{type(e).__name__}: cannot run {argv[0]!r}: {e}"
    if code is None:
        return "timeout", ""
    stdout = stdout.rstrip()
    if code != 0:
        return "error", f"command exited with code {code}" + (f": {stdout[-500:]}" if stdout else "")
    return "ok", stdout


def as_text(value: Any) -> str:
    """A tool's return value as the model reads it: a string as is, JSON values as JSON, anything else str()."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)
