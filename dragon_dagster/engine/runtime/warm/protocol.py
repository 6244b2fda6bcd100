"""Where a warm worker listens, and what makes a job's environment fit it.

One warm worker serves one interpreter, one checkout of this package, one set of library versions and one control
group: the socket's name hashes them, so an upgrade or another virtual environment gets a warm worker of its own,
and a job never runs in (is limited, counted and stopped with) another service's cgroup. A job fits a warm worker
when the variables read while torch, transformers and the other preloaded libraries import are the same in both
(`import_environment`: thread counts, HF_* settings, the interpreter's, and the home, temporary, cache and config
folders, locale and time zone that libraries turn into module constants): a forked child keeps what its parent's
imports read. Everything else a job reads it reads from its own launch: its whole environment (the stores it
writes to among them: DAGSTER_HOME, MLFLOW_TRACKING_URI, DRAGON_RUNS_DIR, DRAGON_FEEDBACK_URL), its working
directory, PYTHONPATH, umask and CPUs (server.py's docstring lists both sides).
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
    "LC_",
    "PANDAS_",
    "NPY_",
    "NUMPY_",
    "FSSPEC_",
)
# Read whole at import, by exact name: the folders libraries turn into module constants (Hugging Face's hub,
# datasets' and accelerate's caches, botocore's and matplotlib's folders under HOME; tempfile's and dill's
# temporary folder), matplotlib's configuration, the locale and the time zone, mlflow's logging set-up.
IMPORT_TIME_NAMES = frozenset(
    {
        "HOME",
        "XDG_CACHE_HOME",
        "XDG_CONFIG_HOME",
        "XDG_DATA_HOME",
        "TMPDIR",
        "TEMP",
        "TMP",
        "LANG",
        "LANGUAGE",
        "TZ",
        "MPLCONFIGDIR",
        "MPLBACKEND",
        "MATPLOTLIBRC",
        "MLFLOW_CONFIGURE_LOGGING",
        "MLFLOW_LOGGING_LEVEL",
    }
)
# What the warm worker's own process is started with besides its import environment: nothing of the launch that
# started it (the stores it named, its Pipes channel, its credentials), so what it imports never depends on which
# project's job came first.
SERVER_VARIABLES = ("PATH", "DRAGON_WARM_DIR", "DRAGON_WARM_IDLE_S")
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
    return {
        k: v
        for k, v in sorted(env.items())
        if (k.startswith(IMPORT_TIME_PREFIXES) or k in IMPORT_TIME_NAMES) and k not in PER_JOB
    }


def python_path(env: Mapping[str, str]) -> list[str]:
    """The folders env's PYTHONPATH puts on sys.path, in order."""
    return [os.path.abspath(p) for p in (env.get("PYTHONPATH") or "").split(os.pathsep) if p]


def difference(warm: Mapping[str, str], job: Mapping[str, str]) -> str:
    """ "" when a job's import environment fits the warm worker's, else the first variable that differs."""
    for name in sorted(set(warm) | set(job)):
        if warm.get(name) != job.get(name):
            return f"{name} is {job.get(name, 'unset')!r} for the job, {warm.get(name, 'unset')!r} in the warm worker"
    return ""


def package_root() -> Path:
    """The folder that holds this checkout's dragon_dagster package."""
    return Path(__file__).resolve().parents[4]


def cgroup() -> str:
    """This process's control groups (/proc/self/cgroup): a warm worker's children are counted, limited and
    stopped with it, so a job is forked only by a warm worker of its own launcher's cgroup ("" off Linux)."""
    try:
        return Path("/proc/self/cgroup").read_text()
    except OSError:
        return ""


@lru_cache(maxsize=1)
def key() -> str:
    """The interpreter, this package's checkout, the preloaded libraries' versions and the cgroup, hashed."""
    versions = {}
    for name in PRELOADED:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = ""
    package = str(package_root() / "dragon_dagster")
    described = json.dumps([sys.executable, sys.version, package, versions, cgroup()])
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
