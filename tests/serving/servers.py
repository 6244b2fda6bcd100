"""A real `dragon serve` on loopback for the serving tests: started as a process (`python -m dragon_dagster.cli
serve ...`), waited for until its own process listens and /health answers, stopped by its process group."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import requests

from tests.support import closed_port, wait_until


class Serve:
    def __init__(self, args: list[str], env: dict, log: Path, timeout: float = 240):
        self.log = log
        for _ in range(3):  # another test may take the chosen port before the server binds it: another port
            self.port = closed_port()
            handle = log.open("a")
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "dragon_dagster.cli", "serve", *args, "--port", str(self.port)],
                env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **env},
                stdout=handle,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            handle.close()
            wait_until(self.up, timeout, f"dragon serve on port {self.port}", alive=self.exited)
            if self.proc.poll() is None:
                return
        raise AssertionError(f"dragon serve did not start:\n{self.text()[-3000:]}")

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def text(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    def exited(self) -> str | None:
        code = self.proc.poll()
        if code is None or "address already in use" in self.text():
            return None
        return f"exited with {code}:\n{self.text()[-3000:]}"

    def up(self) -> bool:
        if self.proc.poll() is not None:
            return "address already in use" in self.text()  # give up on this port
        listening = any(
            c.laddr and c.laddr.port == self.port and c.status == psutil.CONN_LISTEN
            for c in psutil.Process(self.proc.pid).net_connections()
        )
        if not listening:
            return False
        try:
            return requests.get(f"{self.base}/health", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def kill(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)


def wait_for(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
