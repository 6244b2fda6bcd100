"""The warm worker (engine/runtime/warm/): a job forked from it ends as a fresh interpreter's would, killed, terminated
or orphaned (status, exit code, checkpoint), and a job that does not fit it starts cold, saying why."""

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dragon_dagster.engine.artifacts.checkpoints import last_checkpoint
from dragon_dagster.engine.runtime.execution import EXIT_CANCELLED
from dragon_dagster.engine.runtime.warm import client
from dragon_dagster.engine.runtime.worker import PARENT_PID, alive
from tests.support import sft_job, ticket_files, wait_until

WORKER = [sys.executable, "-m", "dragon_dagster.engine.runtime.worker"]
LONG = {"max_steps": 400, "save_steps": 1000, "logging_steps": 1}


def write_job(tmp_path: Path, model: Path, **args) -> Path:
    train, held = ticket_files(tmp_path, 40)
    job = sft_job(tmp_path, model, train, held, **args)
    path = tmp_path / "job.json"
    path.write_text(job.model_dump_json())
    return path


def start(job: Path, warm: bool, **env):
    """The worker for job as the subprocess launcher starts it (this process as its launcher)."""
    proc, how = client.start([*WORKER, str(job)], {**os.environ, PARENT_PID: str(os.getpid()), **env}, warm=warm)
    assert how.startswith("warm start" if warm else "cold start"), how
    return proc


def status(job: Path) -> dict:
    return json.loads((job.parent / "status.json").read_text())


def training(job: Path) -> bool:
    """Whether the worker has logged a training step."""
    progress = job.parent / "out" / "progress.jsonl"
    return progress.exists() and bool(progress.read_text().strip())


def title(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
def test_a_job_reports_the_same_result_warm_or_cold(tiny_model, tmp_path, warm):
    job = write_job(tmp_path, tiny_model, max_steps=2)
    proc = start(job, warm)
    assert proc.wait(timeout=300) == 0
    assert status(job)["event"] == "result" and status(job)["result"]["global_step"] == 2


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
def test_a_worker_killed_with_sigkill_exits_minus_nine_and_reports_nothing(tiny_model, tmp_path, warm):
    job = write_job(tmp_path, tiny_model, **LONG)
    proc = start(job, warm)
    wait_until(lambda: training(job), 300, "the worker to train a step")
    assert os.getsid(proc.pid) == os.getpgid(proc.pid) == proc.pid  # a session and process group of its own
    seen = title(proc.pid)  # what `ps` shows, whichever way it started
    assert "dragon_dagster.engine.runtime.worker" in seen and str(job) in seen
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    assert not (job.parent / "status.json").exists()


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
def test_a_terminated_worker_saves_a_checkpoint_and_exits_cancelled(tiny_model, tmp_path, warm):
    job = write_job(tmp_path, tiny_model, **LONG)
    proc = start(job, warm)
    wait_until(lambda: training(job), 300, "the worker to train a step")
    os.killpg(proc.pid, signal.SIGTERM)  # what the launcher sends when the run is terminated
    assert proc.wait(timeout=120) == EXIT_CANCELLED
    assert status(job)["event"] == "cancelled"
    assert last_checkpoint(tmp_path / "ckpt") is not None


LAUNCHER = textwrap.dedent("""\
    import os, sys, time
    from dragon_dagster.engine.runtime.warm import client
    from dragon_dagster.engine.runtime.worker import PARENT_PID
    proc, how = client.start(sys.argv[2:], {**os.environ, PARENT_PID: str(os.getpid())}, warm=sys.argv[1] == "warm")
    print(proc.pid, how, flush=True)
    time.sleep(600)
    """)


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
def test_a_worker_whose_launcher_dies_saves_a_checkpoint_and_stops(tiny_model, tmp_path, warm):
    job = write_job(tmp_path, tiny_model, **LONG)
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, "warm" if warm else "cold", *WORKER, str(job)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[3],
    )
    pid, how = launcher.stdout.readline().split(" ", 1)
    assert how.startswith("warm start" if warm else "cold start"), how
    wait_until(lambda: training(job), 300, "the worker to train a step")
    launcher.kill()  # its step process killed with -9: nobody is left to stop the worker
    launcher.wait()
    wait_until(lambda: not alive(int(pid)), 120, "the orphaned worker to stop")
    assert status(job)["event"] == "cancelled"
    assert last_checkpoint(tmp_path / "ckpt") is not None


def test_jobs_that_do_not_fit_the_warm_worker_start_cold_saying_why(tmp_path):
    job = tmp_path / "job.json"
    job.write_text("{}")  # not a job: each worker exits at once with an error, which is all this needs
    env = {**os.environ, PARENT_PID: str(os.getpid())}
    threads = str(int(os.environ.get("OMP_NUM_THREADS", "1")) + 1)
    shadow = tmp_path / "shadow"
    (shadow / "torch").mkdir(parents=True)
    cases = {
        "OMP_NUM_THREADS": ([*WORKER, str(job)], {**env, "OMP_NUM_THREADS": threads}, True),
        "HF_HUB_OFFLINE": ([*WORKER, str(job)], {**env, "HF_HUB_OFFLINE": "0"}, True),
        "PYTHONPATH holds": ([*WORKER, str(job)], {**env, "PYTHONPATH": str(shadow)}, True),
        "warm start is off": ([*WORKER, str(job)], env, False),
    }
    client.start([*WORKER, str(job)], env)[0].wait(timeout=300)  # the warm worker runs, so it is what refuses
    for why, (argv, job_env, warm) in cases.items():
        proc, how = client.start(argv, job_env, warm=warm)
        proc.wait(timeout=300)
        assert how.startswith("cold start") and why in how, (why, how)
        assert isinstance(proc, subprocess.Popen)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "-m", WORKER[-1], str(job)]
    assert "torchrun" in client.eligible(torchrun)
    assert "another interpreter" in client.eligible(["/usr/bin/python3", *WORKER[1:], str(job)])
    proc, how = client.start([*WORKER, str(job)], {**env, "PYTHONPATH": str(tmp_path)})  # a project's own path
    assert how.startswith("warm start"), how
    assert proc.wait(timeout=60) != 0


def test_each_forked_worker_imports_from_its_own_python_path(tmp_path):
    """The warm worker keeps the libraries it imported, nothing of a job's: a kind module on one job's PYTHONPATH
    is that job's file, and the next job's is its own."""
    for version in (1, 2):
        package = tmp_path / f"v{version}" / "editedkind"
        package.mkdir(parents=True)
        (package / "__init__.py").write_text(f"raise SystemExit({40 + version})\n")
        job = tmp_path / f"job{version}.json"
        job.write_text(json.dumps({"settings": {"kind": "x"}, "kind_module": "editedkind"}))
        env = {**os.environ, PARENT_PID: str(os.getpid()), "PYTHONPATH": str(package.parent)}
        proc, how = client.start([*WORKER, str(job)], env)
        assert how.startswith("warm start"), how
        assert proc.wait(timeout=60) == 40 + version


def test_a_stopped_warm_worker_lets_its_running_jobs_finish_and_the_next_job_gets_a_new_one(tiny_model, tmp_path):
    """Stopping the warm worker (another test process, an operator) takes it off its socket at once, but a job it
    forked trains on to its result and exit status: its watchdog would stop it if the warm worker went first."""
    job = write_job(tmp_path, tiny_model, max_steps=4)
    proc = start(job, warm=True)
    running = client.status()
    assert (
        running and running["jobs"] >= 1 and running["env"].get("OMP_NUM_THREADS") == os.environ.get("OMP_NUM_THREADS")
    )
    assert client.stop()["pid"] == running["pid"]
    empty = tmp_path / "other" / "job.json"  # its status.json beside it, not beside the first job's
    empty.parent.mkdir()
    empty.write_text("{}")
    other, how = client.start([*WORKER, str(empty)], {**os.environ, PARENT_PID: str(os.getpid())})
    assert how.startswith("warm start") and f"warm worker {running['pid']})" not in how, how  # a new one
    assert other.wait(timeout=120) != 0
    assert proc.wait(timeout=300) == 0 and status(job)["event"] == "result"
    wait_until(lambda: not alive(running["pid"]), 30, "the stopped warm worker to exit after its last job")


def test_a_launcher_without_stdin_still_forks_its_worker(tmp_path):
    """A launcher run with its stdin closed (a daemon, a CI runner): the forked worker gets /dev/null there, as a
    fresh child would, instead of the job falling back to a cold start."""
    job = tmp_path / "job.json"
    job.write_text("{}")
    launcher = subprocess.run(
        [sys.executable, "-c", LAUNCHER.replace("time.sleep(600)", "sys.exit(proc.wait())"), "warm", *WORKER, str(job)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[3],
        preexec_fn=lambda: os.close(0),
        timeout=300,
    )
    pid, how = launcher.stdout.splitlines()[0].split(" ", 1)
    assert how.startswith("warm start"), how
    assert launcher.returncode != 0  # the worker ran and refused the empty job
