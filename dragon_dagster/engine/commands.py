"""Running a command: an argv run directly, never through a shell, with a time limit and a bounded stdout.

The lowest layer beside text, so that every layer above runs commands the same way: the command reward
(rewards/command.py) scores a completion with one, and a pipeline's command tools (tools/declare.py) answer a call
with one.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Sequence

STDOUT_TAIL = 64 * 1024  # the most of stdout kept: memory stays flat however much a command prints


def run_command(argv: Sequence[str], stdin: bytes | None, timeout: float) -> tuple[int | None, str]:
    """Run argv directly (no shell); its exit code, or None after a timeout, and the tail of its stdout.

    stdin is piped in by one thread while another keeps only the last bytes of stdout, so neither a command
    that ignores its input nor one that prints gigabytes can block or exhaust memory. The command gets its own
    process group, so a timeout also ends whatever it started.
    """
    posix = os.name == "posix"
    proc = subprocess.Popen(
        list(argv),
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=posix,
    )
    tail = bytearray()
    threads = [threading.Thread(target=_drain, args=(proc.stdout, tail), daemon=True)]
    if stdin is not None:
        threads.append(threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True))
    for t in threads:
        t.start()
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        code = None
    _kill_group(proc, posix)  # also after a normal exit: leftovers would hold stdout open and keep running
    for t in threads:
        t.join(timeout=5)
    proc.stdout.close()
    return code, bytes(tail).decode("utf-8", errors="replace")


def _drain(stream, tail: bytearray) -> None:
    for chunk in iter(lambda: os.read(stream.fileno(), 65536), b""):
        tail.extend(chunk)
        del tail[:-STDOUT_TAIL]


def _feed(stream, data: bytes) -> None:
    try:
        stream.write(data)
        stream.close()
    except OSError:  # the command exited or closed stdin without reading it all; that is its choice
        pass


def _kill_group(proc: subprocess.Popen, posix: bool) -> None:
    try:
        if posix:
            os.killpg(proc.pid, signal.SIGKILL)
        elif proc.poll() is None:
            proc.kill()
    except OSError:
        pass  # already gone
    proc.wait()
