"""The warm worker: `python -m dragon_dagster.engine.runtime.warm.server --socket PATH`.

It imports the heavy libraries once (no torch op runs and CUDA is never touched, so a fork is safe), listens on a
Unix socket, and for each job forks a child that becomes the worker, and reaps it and sends the launcher its exit
status. It exits after IDLE_S without a job, or when its socket is removed or taken over by another warm worker.

One warm worker serves every launcher of its user, interpreter, checkout, library versions and cgroup (the key,
protocol.py), whichever project, Dagster home or store that launcher belongs to: one project's job may be forked
by a warm worker that another project's job started. That is safe because a job takes from its launch all that
tells projects apart, and from the warm worker only what is the same for both.

From its launch (the request on the socket), a forked job takes:
- its environment, whole: the warm worker's is cleared first, so the stores a job writes to (DAGSTER_HOME,
  MLFLOW_TRACKING_URI, DRAGON_RUNS_DIR, DRAGON_FEEDBACK_URL, AWS_* for an object store) and every other variable
  are its launcher's, as a fresh interpreter's would be;
- its command line (the job file, which names its output directory), working directory (also where the libraries'
  start-folder constants point: START_FOLDER) and sys.path (the working directory, its own PYTHONPATH, then the
  interpreter's folders);
- its stdin, stdout and stderr (passed over the socket), umask and CPUs (sched_setaffinity);
- this package, imported afresh: the warm worker's own modules of it are dropped, so its module-level caches
  (lru_caches, settings read at import) are computed from the job's environment, and an edited checkout runs as
  edited;
- a session and process group of its own, default signal handlers, and the worker's command line as its title.

From the warm worker, it takes:
- the libraries it imported (torch, transformers, TRL, PEFT, datasets, mlflow through TRL, ...) and what they
  computed while importing: the warm worker forks only a job whose import environment (protocol.py's
  `import_environment`: thread counts, HF_*, CUDA, the home, temporary, cache and config folders, locale, time
  zone) is the same as its own, so these are what the job's own imports would have computed. None of them holds a
  store: mlflow reads its tracking URI when a client is made, not at import. The warm worker itself is started
  with only its import environment (client.py's `launch_server`): nothing of the project whose job started it;
- its cgroup (the key: every launcher it serves is in it), user (its socket's folder is its user's alone), groups,
  resource limits (ulimit) and nice value, as the launch that started it had them;
- its parent: the warm worker, so its watchdog follows the launcher's pid instead.
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import os
import select
import signal
import socket
import sys
import threading
import time
import traceback
from pathlib import Path

from .protocol import (
    IDLE_S,
    WARM_PARENT,
    WORKER_MODULE,
    Lines,
    difference,
    import_environment,
    pid_path,
    python_path,
    send,
)

# What a worker imports on its way to its first training step, beyond this package: importing these here is
# what the warm worker saves each job (transformers and TRL import their submodules lazily: named one by one).
PRELOAD = (
    "torch",
    "numpy",
    "pandas",
    "pyarrow",
    "datasets",
    "transformers",
    "transformers.modeling_utils",
    "transformers.trainer",
    "transformers.generation.utils",
    "transformers.models.llama.modeling_llama",
    "transformers.models.auto.modeling_auto",
    "transformers.models.auto.tokenization_auto",
    "accelerate",
    "peft",
    "trl",
    "trl.trainer.sft_trainer",
    "trl.trainer.dpo_trainer",
    "trl.trainer.grpo_trainer",
    "trl.trainer.kto_trainer",
    "trl.trainer.reward_trainer",
    "matplotlib",
    "matplotlib.figure",
    "matplotlib.backends.backend_agg",
    "gguf",
    "dagster_pipes",
    "psutil",
    "pydantic",
    "yaml",
)


def preload() -> list[str]:
    """Import PRELOAD; the names that failed (an optional library missing is no reason not to serve)."""
    missing = []
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a child imports it again and reports the error where it matters
            missing.append(name)
    return missing


def refusal(request: dict, own_env: dict[str, str]) -> str:
    """Why a job must start cold instead ("" when it may be forked from here)."""
    argv = request.get("argv") or []
    if argv[:3] != [sys.executable, "-m", WORKER_MODULE]:
        return "its command is not this interpreter's worker"
    differs = difference(own_env, import_environment(request.get("env") or {}))
    if differs:
        return differs
    shadowing = shadowed(python_path(request.get("env") or {}))
    if shadowing:
        return f"its PYTHONPATH holds {shadowing}, which the warm worker imported from elsewhere"
    if "torch" in sys.modules and sys.modules["torch"].cuda.is_initialized():
        return "CUDA is initialised in the warm worker"
    if threading.active_count() > 1:  # native pools (OpenBLAS's) handle a fork themselves; Python threads do not
        return f"the warm worker runs {threading.active_count()} Python threads (a fork copies only one)"
    return ""


def shadowed(folders: list[str]) -> str:
    """The first preloaded top-level package that one of folders would put ahead of the one imported here."""
    tops = {name.split(".")[0] for name in PRELOAD}
    for folder in folders:
        for top in sorted(tops):
            if os.path.exists(os.path.join(folder, top)) or os.path.exists(os.path.join(folder, f"{top}.py")):
                return os.path.join(folder, top)
    return ""


def job_sys_path(cwd: str, env: dict[str, str]) -> list[str]:
    """sys.path as `python -m` in cwd with env's PYTHONPATH would start: cwd, the job's PYTHONPATH, then the
    interpreter's own folders (this process's, less its own start folder and PYTHONPATH)."""
    own = set(python_path(os.environ))
    return [cwd, *python_path(env), *(p for p in sys.path[1:] if p not in own)]


# Module constants that libraries set, as they import, to the folder their process started in: the warm worker's
# ("/") until a child sets them to its job's (multiprocessing's is where a spawned child resolves its paths).
START_FOLDER = (
    ("multiprocessing.process", "ORIGINAL_DIR"),
    ("multiprocess.process", "ORIGINAL_DIR"),
    ("rich", "_IMPORT_CWD"),
)


def become_worker(request: dict, fds: list[int], close: list[socket.socket]) -> None:
    """In the forked child: turn into the job's worker process, run it, and exit with its code. Never returns."""
    code = 1
    try:
        for conn in close:
            conn.close()
        os.setsid()
        for number in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGALRM, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(number, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        for target, fd in zip((0, 1, 2), fds):
            os.dup2(fd, target)
            os.close(fd)
        if os.isatty(1):
            sys.stdout.reconfigure(line_buffering=True)
        os.chdir(request["cwd"])
        for module, name in START_FOLDER:
            if module in sys.modules and getattr(sys.modules[module], name, None):
                setattr(sys.modules[module], name, os.getcwd())
        if request.get("umask") is not None:
            os.umask(request["umask"])
        if request.get("cpus"):
            os.sched_setaffinity(0, request["cpus"])
        sys.path[:] = job_sys_path(request["cwd"], request["env"])
        os.environ.clear()  # the warm worker's own environment goes whole: the job's is its launcher's
        os.environ.update(request["env"])
        os.environ[WARM_PARENT] = str(os.getppid())
        for name in [n for n in sys.modules if n == "dragon_dagster" or n.startswith("dragon_dagster.")]:
            del sys.modules[name]  # imported afresh: an edited checkout runs as edited
        args = request["argv"][3:]
        title(request["argv"], request.get("launcher"))
        from dragon_dagster.engine.runtime import worker

        sys.argv = [worker.__file__, *args]
        worker.finish(worker.main(args))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        from dragon_dagster.engine.runtime.execution import EXIT_CANCELLED

        if code != EXIT_CANCELLED:  # worker.finish leaves a cancelled job without waiting on anything
            atexit._run_exitfuncs()
    except BaseException:  # noqa: BLE001 - whatever happens, this child must not return into the server's loop
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed pipe at exit
                pass
        os._exit(code)


def title(argv: list[str], launcher: int | None) -> None:
    """The worker's command line as `ps` shows it, as a fresh worker's, with the launcher a forked one serves."""
    try:
        from setproctitle import setproctitle
    except ImportError:  # a title is for people and tests that look for workers; the job runs without it
        return
    setproctitle(" ".join(argv) + (f" [warm, for pid {launcher}]" if launcher else " [warm]"))


class Server:
    def __init__(self, path: Path, idle_s: float, env: dict[str, str]):
        """env: the import environment as it was before the imports (torch sets variables of its own)."""
        self.path, self.idle_s = path, idle_s
        self.children: dict[int, socket.socket] = {}
        self.env = env
        self.last = time.monotonic()
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        staging = path.with_name(f"{path.name}.{os.getpid()}")
        staging.unlink(missing_ok=True)
        self.listener.bind(str(staging))
        self.listener.listen(64)
        os.replace(staging, path)  # whole: a client never connects to a half-set-up socket
        self.inode = path.stat().st_ino
        self.listening = True

    def owns_socket(self) -> bool:
        try:
            return self.path.stat().st_ino == self.inode
        except OSError:
            return False

    def serve(self) -> None:
        """Serve until asked to stop, idle, or replaced; then take no new job but stay until every forked
        worker has ended and been told its status (their watchdogs would stop them if this process went first)."""
        while self.listening or self.children:
            if self.listening:
                readable, _, _ = select.select([self.listener], [], [], 0.2)
                if readable:
                    self.accept()
            else:
                time.sleep(0.2)
            self.reap()
            if not self.listening:
                continue
            if not self.children and time.monotonic() - self.last > self.idle_s:
                self.stop_listening(f"idle for {self.idle_s:.0f} s")
            elif not self.owns_socket():
                self.stop_listening(f"socket {self.path} removed or replaced")
        print(f"warm worker {os.getpid()}: exiting", flush=True)

    def accept(self) -> None:
        conn, _ = self.listener.accept()
        self.last = time.monotonic()
        try:
            self.handle(conn)
        except Exception:  # noqa: BLE001 - one bad request never takes the server down
            traceback.print_exc()
            conn.close()

    def stop_listening(self, why: str) -> None:
        """No new jobs: the socket and the pid file go (the next job starts another warm worker at once)."""
        print(f"warm worker {os.getpid()}: {why}; {len(self.children)} job(s) still running", flush=True)
        self.listening = False
        self.listener.close()
        if self.owns_socket():
            self.path.unlink(missing_ok=True)
        pid_file = pid_path(self.path)
        try:
            if int(pid_file.read_text()) == os.getpid():
                pid_file.unlink()
        except (OSError, ValueError):
            pass

    def handle(self, conn: socket.socket) -> None:
        """Serve one request."""
        conn.settimeout(30)
        lines = Lines(conn)
        request = lines.read(want_fds=3)
        if request is None:
            conn.close()
            return
        op = request.get("op")
        if op in ("ping", "stop"):
            if op == "stop":  # off the socket before the answer: a job that follows goes to a new warm worker
                self.stop_listening("asked to stop")
            send(
                conn, {"pid": os.getpid(), "jobs": len(self.children), "env": self.env, "variables": sorted(os.environ)}
            )
            conn.close()
            return
        why = refusal(request, self.env) or (len(lines.fds) != 3 and "no stdin, stdout and stderr came with it")
        if why:
            send(conn, {"cold": why})
            for fd in lines.fds:
                os.close(fd)
            conn.close()
            return
        pid = os.fork()
        if pid == 0:
            become_worker(request, lines.fds, [self.listener, conn, *self.children.values()])
        for fd in lines.fds:
            os.close(fd)
        send(conn, {"pid": pid, "server": os.getpid()})
        self.children[pid] = conn

    def reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is None:
                continue
            try:
                send(conn, {"exit": os.waitstatus_to_exitcode(status)})
            except OSError:  # the launcher is gone
                pass
            conn.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", required=True)
    parser.add_argument("--idle-s", type=float, default=IDLE_S)
    args = parser.parse_args(argv)
    try:  # first: it takes over the memory argv and environ lie in (on its first call), whole only while untouched
        import setproctitle

        setproctitle.setproctitle(setproctitle.getproctitle())
    except ImportError:
        pass
    # Arrow's jemalloc starts a purging thread when it loads: none in a process that forks (the children inherit
    # the setting, and free memory back to the system a little later)
    os.environ.setdefault("JE_ARROW_MALLOC_CONF", "background_thread:false")
    env = import_environment(os.environ)
    started = time.monotonic()
    missing = preload()
    print(
        f"warm worker {os.getpid()}: imported in {time.monotonic() - started:.1f} s"
        + (f" (not importable here: {', '.join(missing)})" if missing else ""),
        flush=True,
    )
    Server(Path(args.socket), args.idle_s, env).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
