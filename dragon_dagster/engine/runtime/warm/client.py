"""Starting a worker: forked from the warm worker where the job fits it, a fresh interpreter where not.

start(argv, env) returns a process object with what a launcher uses of subprocess.Popen (pid, poll, wait,
returncode) and a line saying how it started, for the step's log. The first job of an interpreter starts the warm
worker (one at a time: a lock file) and waits for its imports; a job that does not fit it starts cold, saying why.
"""

from __future__ import annotations

import fcntl
import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .protocol import (
    SERVER_VARIABLES,
    WORKER_MODULE,
    Lines,
    home,
    import_environment,
    key,
    package_root,
    pid_path,
    python_path,
    send,
    socket_path,
)

READY_S = 180  # the warm worker's imports on a busy 2-core machine; past this a job starts cold
LOST = 1  # the exit status of a forked worker whose warm worker died before it could say


class WarmProcess:
    """A worker forked by the warm worker, as a launcher sees a Popen: its exit status comes over the socket."""

    def __init__(self, conn: socket.socket, lines: Lines, pid: int, args: list[str]):
        self.conn, self.lines, self.pid, self.args = conn, lines, pid, args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self._read(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not self._read(left) and deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def _read(self, timeout: float | None) -> bool:
        """Take the exit status if it came within timeout; whether the process has ended."""
        if not self.lines.buffer:
            readable, _, _ = select.select([self.conn], [], [], timeout)
            if not readable:
                return False
        try:
            message = self.lines.read()
        except OSError:
            message = None
        if message is None:  # the warm worker died: the child's watchdog stops it (its parent changed)
            while _alive(self.pid):
                time.sleep(0.2)
            self.returncode = LOST
        else:
            self.returncode = int(message["exit"])
        self.conn.close()
        return True


def start(argv: list[str], env: dict[str, str], warm: bool = True) -> tuple[subprocess.Popen | WarmProcess, str]:
    """The worker for argv with env, and how it started ("warm: ..." or "cold: <why>")."""
    why = "warm start is off" if not warm else eligible(argv)
    if not why:
        for _ in range(2):  # once more after a connection the warm worker reset as it stopped listening
            try:
                proc, why = fork(argv, env)
                break
            except OSError as exc:
                proc, why = None, f"the warm worker could not be reached ({exc})"
        if proc is not None:
            return proc, why
    cold = subprocess.Popen(argv, start_new_session=True, env=env)  # a process group of its own, as a fork's
    return cold, f"cold start: {why}"


def eligible(argv: list[str]) -> str:
    """ "" when argv is this interpreter's worker command, else why it cannot be forked."""
    if argv[:3] == [sys.executable, "-m", WORKER_MODULE] and len(argv) == 4:
        return ""
    if WORKER_MODULE in argv and "torch.distributed.run" in argv:
        return "torchrun starts its ranks itself"
    return "the worker runs in another interpreter"


def fork(argv: list[str], env: dict[str, str]) -> tuple[WarmProcess | None, str]:
    conn = connect(env)
    if isinstance(conn, str):
        return None, conn
    lines = Lines(conn)
    request = {
        "argv": argv,
        "env": env,
        "cwd": os.getcwd(),
        "launcher": os.getpid(),
        "umask": umask(),
        "cpus": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
    }
    with standard_streams() as fds:
        send(conn, request, fds=fds)
    conn.settimeout(60)
    answer = lines.read()
    conn.settimeout(None)
    if answer is None or "pid" not in answer:
        conn.close()
        return None, (answer or {}).get("cold") or "the warm worker closed the connection"
    return WarmProcess(conn, lines, int(answer["pid"]), argv), f"warm start (forked by warm worker {answer['server']})"


def umask() -> int | None:
    """This process's umask, read without setting it (os.umask sets one, for every thread meanwhile)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return None


@contextmanager
def standard_streams() -> Iterator[list[int]]:
    """This process's stdin, stdout and stderr as the worker gets them; /dev/null for any that is closed (a
    launcher run without a terminal or with no stdin), as a fresh child would find it."""
    opened = []
    fds = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
            fds.append(fd)
        except OSError:
            opened.append(os.open(os.devnull, os.O_RDWR))
            fds.append(opened[-1])
    try:
        yield fds
    finally:
        for fd in opened:
            os.close(fd)


def connect(env: dict[str, str]) -> socket.socket | str:
    """A connection to this interpreter's warm worker, started first if none runs; else why not."""
    path = socket_path()
    conn = _connect(path)
    if conn is not None:
        return conn
    starting = prestart(env)
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        conn = _connect(path)
        if conn is not None:
            return conn
        if not _alive(starting):
            return f"the warm worker exited before it listened (see {log_path()})"
        time.sleep(0.1)
    return f"the warm worker was not ready within {READY_S} s (see {log_path()})"


def prestart(env: dict[str, str]) -> int:
    """The pid of the warm worker that runs or is starting; one is started if none is (one at a time: a lock),
    without waiting for its imports (a pipeline's first steps run meanwhile)."""
    with open(home() / f"{key()}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        pid_file = pid_path(socket_path())
        try:
            pid = int(pid_file.read_text())
        except (OSError, ValueError):
            pid = 0
        if pid and _alive(pid):
            return pid
        pid = launch_server(socket_path(), env).pid
        pid_file.write_text(str(pid))
        return pid


def launch_server(path: Path, env: dict[str, str]) -> subprocess.Popen:
    """The warm worker, detached: a session of its own, no terminal, its output in a log beside its socket.
    Its environment is the job's import environment, PATH and its own settings, and a PYTHONPATH only where the
    job's names this checkout (how an uninstalled checkout is found): nothing else of the launch that starts it
    (the project's stores, a Dagster step's Pipes channel, credentials, a project's own path) goes with it, so
    what it imports is the same whichever project's job starts it."""
    root = str(package_root())
    checkout = [p for p in python_path(env) if os.path.realpath(p) == root]
    env = {
        **{name: env[name] for name in SERVER_VARIABLES if name in env},
        **import_environment(env),
        **({"PYTHONPATH": checkout[0]} if checkout else {}),
    }
    with open(log_path(), "a") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "dragon_dagster.engine.runtime.warm.server", "--socket", str(path)],
            env=env,
            cwd="/",
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def log_path() -> Path:
    return home() / f"{key()}.log"


def _connect(path: Path) -> socket.socket | None:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(str(path))
    except OSError:
        conn.close()
        return None
    return conn


def status() -> dict | None:
    """The running warm worker's pid, its jobs, its import environment (`env`) and the names of every variable in
    its own environment (`variables`); None when none runs."""
    return _ask("ping")


def stop() -> dict | None:
    """Ask the warm worker to take no new job and exit once its running jobs have ended (the next job starts a
    new one); what it said, None when none ran."""
    return _ask("stop")


def _ask(op: str) -> dict | None:
    conn = _connect(socket_path())
    if conn is None:
        return None
    with conn:
        conn.settimeout(10)
        send(conn, {"op": op})
        return Lines(conn).read()


def _alive(pid: int) -> bool:
    from ..worker import alive

    return alive(pid)
