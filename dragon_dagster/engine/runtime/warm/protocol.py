"""Where a warm worker listens, and what makes a job's environment fit it.

One warm worker serves one interpreter, one checkout of this package and one set of library versions: the socket's
name hashes them, so an upgrade or another virtual environment gets a warm worker of its own. A job fits a warm
worker when the variables read while torch, transformers and their native libraries import (thread counts, HF_*
settings, the Python path) are the same in both: a forked child keeps what its parent's imports read.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
from collections.abc import Mapping
from functools import lru_cache
from importlib import metadata
from pathlib import Path

WORKER_MODULE = "dragon_dagster.engine.runtime.worker"
# The libraries a warm worker imports; their versions name it.
PRELOADED = ("torch", "transformers", "peft", "trl", "datasets", "accelerate")
# Variables that imports read (OpenMP and BLAS thread pools, CUDA, the hub's and the libraries' settings, the
# interpreter's own): a job whose values differ from the warm worker's starts cold.
IMPORT_TIME_PREFIXES = (
    "OMP_",
    "MKL_",
    "OPENBLAS_",
    "GOTO",
    "VECLIB_",
    "NUMEXPR_",
    "KMP_",
    "CUDA_",
    "NVIDIA_",
    "NCCL_",
    "TORCH",
    "PYTORCH_",
    "HF_",
    "HUGGINGFACE_",
    "TRANSFORMERS_",
    "TOKENIZERS_",
    "TRL_",
    "ACCELERATE_",
    "DATASETS_",
    "PYTHON",
    "LD_",
)
IDLE_S = float(os.environ.get("DRAGON_WARM_IDLE_S", "600"))  # a warm worker with no job for this long exits
# Set in a forked child: the warm worker's pid (its parent), so the watchdog follows the launcher instead.
WARM_PARENT = "DRAGON_WORKER_WARM_PARENT"


# A forked child takes the job's PYTHONPATH into its sys.path itself (the warm worker refuses one that would shadow a
# library it imported), so a job may differ from the warm worker there: a Dagster project on its own path, say.
# TORCHINDUCTOR_CACHE_DIR: torch sets it when it imports (a launcher that imported torch passes it on), and only
# compiling reads it, in the child, from the job's own environment.
PER_JOB = ("PYTHONPATH", "TORCHINDUCTOR_CACHE_DIR")


def import_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of env that imports read."""
    return {k: v for k, v in sorted(env.items()) if k.startswith(IMPORT_TIME_PREFIXES) and k not in PER_JOB}


def python_path(env: Mapping[str, str]) -> list[str]:
    """The folders env's PYTHONPATH puts on sys.path, in order."""
    return [os.path.abspath(p) for p in (env.get("PYTHONPATH") or "").split(os.pathsep) if p]


def difference(warm: Mapping[str, str], job: Mapping[str, str]) -> str:
    """ "" when a job's import environment fits the warm worker's, else the first variable that differs."""
    for name in sorted(set(warm) | set(job)):
        if warm.get(name) != job.get(name):
            return f"{name} is {job.get(name, 'unset')!r} for the job, {warm.get(name, 'unset')!r} in the warm worker"
    return ""


@lru_cache(maxsize=1)
def key() -> str:
    """The interpreter, this package's checkout and the preloaded libraries' versions, hashed."""
    versions = {}
    for name in PRELOADED:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = ""
    package = str(Path(__file__).resolve().parents[3])
    described = json.dumps([sys.executable, sys.version, package, versions])
    return hashlib.sha256(described.encode()).hexdigest()[:16]


def home() -> Path:
    """The folder of the warm workers' sockets, locks and logs ($DRAGON_WARM_DIR; short: a socket path is)."""
    path = Path(os.environ.get("DRAGON_WARM_DIR") or f"/tmp/dragon-warm-{os.getuid()}")
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def socket_path() -> Path:
    return home() / f"{key()}.sock"


def pid_path(socket: Path) -> Path:
    """The pid of the warm worker that listens, or is starting to listen, on socket."""
    return socket.with_suffix(".pid")


def send(conn: socket.socket, message: dict, fds: list[int] | None = None) -> None:
    data = (json.dumps(message) + "\n").encode()
    if fds:
        socket.send_fds(conn, [data], fds)
    else:
        conn.sendall(data)


class Lines:
    """Newline-delimited JSON messages read off a socket (and the file descriptors sent with the first)."""

    def __init__(self, conn: socket.socket):
        self.conn, self.buffer, self.fds = conn, b"", []

    def read(self, want_fds: int = 0) -> dict | None:
        """The next message; None at end of stream."""
        while b"\n" not in self.buffer:
            if want_fds and not self.fds:
                data, fds, _, _ = socket.recv_fds(self.conn, 1 << 16, want_fds)
                self.fds.extend(fds)
            else:
                data = self.conn.recv(1 << 16)
            if not data:
                return None
            self.buffer += data
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)
