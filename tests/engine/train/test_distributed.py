"""Data-parallel training (`parallel: {workers: N}`): the worker under torchrun and as a Ray job's driver.

Real processes throughout: torchrun ranks on gloo, a Ray head on loopback. The global batch stays the
settings' batch_size, so two workers must learn what one does: the same loss and gradient norm, step after
step, and identical weights on every rank (the chunked loss head goes through DDP's forward for that).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dragon_dagster.engine import catalog
from dragon_dagster.engine.artifacts.checkpoints import checkpoint_problem
from dragon_dagster.engine.config.hardware import Hardware, Speed
from dragon_dagster.engine.config.job import Parallel, TrainingInputs
from dragon_dagster.engine.data import row_mapping, tables
from dragon_dagster.engine.pipeline.definition import EXAMPLE_DIR
from dragon_dagster.engine.runtime.execution import EXIT_CANCELLED, JobError, load_job
from dragon_dagster.engine.runtime.worker import PARENT_PID
from dragon_dagster.engine.stages.dpo.settings import DPO
from dragon_dagster.engine.stages.grpo.settings import GRPO
from dragon_dagster.engine.stages.sft.settings import SFT
from dragon_dagster.engine.train import distributed

# 2 vs 1 workers on the tiny model, 6 steps: measured loss within 2e-7 relative, grad norm equal; the bound
# leaves room for summation order (per-rank sums, then DDP's average) on other hardware.
CURVE_RTOL = {"loss": 1e-4, "grad_norm": 1e-3}
# The gradient norm differs more than the loss between one process and two: the all-reduce adds the ranks' halves in
# another order, and at learning rate 5e-2 six Adam steps carry that into the weights. Measured: 7e-4 relative at step
# 6 on an Intel Xeon (AVX-512), within 1e-4 on an AMD EPYC (AVX2); a real data-parallel error is orders larger.
SFT_ARGS = {
    "max_steps": 6,
    "batch_size": 4,
    "grad_accum": 1,
    "logging_steps": 1,
    "save_steps": 100,
    "max_seq_len": 96,
    "learning_rate": 5e-2,
    "warmup_ratio": 0.0,
}
NO_DROPOUT = {"dropout": 0.0}  # LoRA dropout draws differ per rank; without it the runs are comparable
# max_seq_len 96 keeps all 48 rows (shorter truncates most replies away); 6 steps x 4 rows stay in one epoch: at
# a ragged epoch end accelerate pads the last batch per rank (even_batches), so that step differs by design


def worker_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DAGSTER_PIPES") and k != "RAY_ADDRESS"}
    # RAY_AUTH_MODE: a loopback test cluster needs no token (and Ray would otherwise write one to ~/.ray)
    # RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0: a driver joins the loopback head as the head's own processes see it
    env.update(
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        OMP_NUM_THREADS="1",
        RAY_AUTH_MODE="disabled",
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
        **extra,
    )
    return env


def torchrun_command(job_file: Path, workers: int, shutdown_s: int = 600) -> list[str]:
    """What the launcher runs for backend torchrun (the training resource's termination_timeout_s: 600 s)."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(workers),
        f"--shutdown-timeout={shutdown_s}",
        "-m",
        "dragon_dagster.engine.runtime.worker",
        str(job_file),
    ]


def write_job(
    work: Path, model: Path, stage, train_file: Path, workers: int = 1, backend: str = "torchrun", **inputs
) -> Path:
    """job.json as the launcher writes it (the kind's typed job); the parallel entry only for more than one
    worker. inputs: more of the training inputs (eval_file, resume_from)."""
    (work / "out").mkdir(parents=True, exist_ok=True)
    job = catalog.get(stage.kind).job_model()(
        settings=stage,
        inputs=TrainingInputs(
            model=str(model), train_file=str(train_file), checkpoint_dir=str(work / "ckpt"), **inputs
        ),
        output_dir=str(work / "out"),
        hardware=Hardware(device="cpu"),
        speed=Speed(loss_kernel="chunked", packing="off"),
        parallel=(
            Parallel(workers=workers, backend=backend, cpus_per_worker=1, gpus_per_worker=0) if workers > 1 else None
        ),
    )
    (work / "job.json").write_text(job.model_dump_json())
    return work / "job.json"


def run(command: list[str], work: Path, timeout: int = 300, **env) -> subprocess.CompletedProcess:
    done = subprocess.run(command, cwd=work, env=worker_env(**env), capture_output=True, text=True, timeout=timeout)
    (work / "log.txt").write_text(done.stdout + done.stderr)
    return done


def progress(work: Path) -> list[dict]:
    rows = [json.loads(line) for line in (work / "out" / "progress.jsonl").read_text().splitlines()]
    return [r for r in rows if r.get("loss") is not None]


def status(work: Path) -> dict:
    return json.loads((work / "status.json").read_text())


def sft_stage(**args) -> SFT:
    return SFT(
        name="sft_adapter",
        kind="sft",
        dataset="tickets",
        args={**SFT_ARGS, **args},
        lora=NO_DROPOUT,
        n_samples=1,
        max_new_tokens=4,
    )


@pytest.fixture(scope="module")
def tickets(tmp_path_factory) -> Path:
    rows = row_mapping.map_rows(
        tables.read_table(EXAMPLE_DIR / "tickets.csv"),
        row_mapping.Mapping(prompt="{subject}\n\n{body}", response="reply"),
    )[:48]
    path = tmp_path_factory.mktemp("data") / "tickets.jsonl"
    tables.write_jsonl(path, rows)
    return path


@pytest.fixture(scope="module")
def sft_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("sft")


@pytest.fixture(scope="module")
def sft_two(tiny_model, tickets, sft_root) -> subprocess.CompletedProcess:
    """The SFT stage on two workers (torchrun), once for the module: the Ray test compares with it alone, so the
    slow suite, which runs only that test here, does not train the one-worker run too."""
    two = write_job(sft_root / "two", tiny_model, sft_stage(), tickets, workers=2)
    done = run(torchrun_command(two, 2), sft_root / "two")
    assert done.returncode == 0, f"two:\n{(sft_root / 'two' / 'log.txt').read_text()[-4000:]}"
    return done


@pytest.fixture(scope="module")
def sft_runs(tiny_model, tickets, sft_root, sft_two) -> dict:
    """The same SFT stage with one worker (the plain command) and two (torchrun), once for the module."""
    one = write_job(sft_root / "one", tiny_model, sft_stage(), tickets)
    done = run([sys.executable, "-m", "dragon_dagster.engine.runtime.worker", str(one)], sft_root / "one")
    assert done.returncode == 0, f"one:\n{(sft_root / 'one' / 'log.txt').read_text()[-4000:]}"
    return {"root": sft_root, "one": done, "two": sft_two}


def assert_same_curve(rows: list[dict], expected: list[dict]) -> None:
    assert [r["step"] for r in rows] == [r["step"] for r in expected] == list(range(1, 7))
    for key in ("loss", "grad_norm"):
        assert [r[key] for r in rows] == pytest.approx([r[key] for r in expected], rel=CURVE_RTOL[key]), key


def test_two_workers_learn_what_one_does_with_the_same_global_batch(sft_runs):
    root = sft_runs["root"]
    assert_same_curve(progress(root / "two"), progress(root / "one"))
    for key in ("num_tokens", "mean_token_accuracy"):  # counted over both ranks, as TRL counts them
        assert [r[key] for r in progress(root / "two")] == [r[key] for r in progress(root / "one")], key
    assert progress(root / "one")[-1]["loss"] < progress(root / "one")[0]["loss"]  # it learns: a real gradient
    log = sft_runs["two"].stdout
    # the ranks compared their trained weights: identical, so the gradients were all-reduced
    assert "trainable weights identical on all 2 ranks" in log
    assert "[rank 1] trainable weights identical on all 2 ranks" in log
    # only rank 0 wrote: one progress row per step, the artifact, and the outcome
    assert (root / "two" / "out" / "adapter" / "adapter_model.safetensors").exists()
    assert status(root / "two")["event"] == "result" and status(root / "two")["result"]["global_step"] == 6
    assert "[rank 1] training" in log and "[rank 0]" not in log


def test_the_global_batch_must_split_evenly_and_the_error_names_it():
    from dragon_dagster.engine.train.reinforce.worker import per_worker_completions

    assert distributed.split_batch(8, 2) == 4 and distributed.split_batch(5, 1) == 5
    with pytest.raises(ValueError, match=r"batch_size \(6\) must be divisible by the number of workers \(4\)"):
        distributed.split_batch(6, 4)
    assert per_worker_completions(3, 4, 2) == 6  # prompts need not split: a group may span workers
    with pytest.raises(
        ValueError,
        match=r"batch_size x group_size .*3 x 3.* must be divisible by the number "
        r"of workers \(2\)",
    ):
        per_worker_completions(3, 3, 2)
    typed = catalog.get("sft").job_model()(
        settings=sft_stage(),
        inputs=TrainingInputs(model="model", train_file="train.jsonl", checkpoint_dir="ckpt"),
        output_dir="out",
    )
    job = typed.model_dump()
    assert load_job(job)[0].parallel is None
    with pytest.raises(JobError, match="parallel.backend"):
        load_job({**job, "parallel": {"workers": 2, "backend": "mpi"}})


def test_two_workers_train_dpo(tiny_model, tickets, tmp_path):
    pairs = [
        {
            "prompt": r["prompt"],
            "chosen": r["completion"],
            "rejected": [{"role": "assistant", "content": "Please wait."}],
        }
        for r in tables.read_jsonl(tickets)
    ]
    tables.write_jsonl(tmp_path / "pairs.jsonl", pairs[:16])
    tables.write_jsonl(tmp_path / "held.jsonl", pairs[16:20])  # the evaluation is sharded: every rank takes part
    stage = DPO(name="dpo_adapter", kind="dpo", dataset="pairs", n_samples=1, max_new_tokens=4)
    stage = stage.model_copy(update={"args": stage.args.model_copy(update={**SFT_ARGS, "max_steps": 3})})
    job = write_job(
        tmp_path, tiny_model, stage, tmp_path / "pairs.jsonl", workers=2, eval_file=str(tmp_path / "held.jsonl")
    )
    done = run(torchrun_command(job, 2), tmp_path)
    assert done.returncode == 0, (tmp_path / "log.txt").read_text()[-4000:]
    result = status(tmp_path)["result"]
    assert result["global_step"] == 3 and result["eval_pairs"] == 4 and 0 <= result["pref_accuracy"] <= 1
    assert (tmp_path / "out" / "adapter" / "adapter_model.safetensors").exists()
    assert "trainable weights identical on all 2 ranks" in done.stdout
    assert [r["step"] for r in progress(tmp_path)] == [1, 2, 3]


def test_two_workers_train_grpo_with_a_group_spanning_them(tiny_model, tmp_path):
    prompts = row_mapping.map_prompts(
        tables.read_table(EXAMPLE_DIR / "arithmetic.csv"),
        row_mapping.PromptsMapping(prompt="question", reference="answer"),
    )[:8]
    tables.write_jsonl(tmp_path / "prompts.jsonl", prompts)
    # 1 prompt x 4 completions per step: each rank scores 2 of the group, TRL gathers the rewards
    stage = GRPO(
        name="grpo_adapter",
        kind="grpo",
        dataset="prompts",
        group_size=4,
        temperature=0.7,
        max_new_tokens=6,
        max_eval_prompts=1,
        n_samples=1,
        rewards=[{"type": "length", "max_chars": 24}],
        args={
            "max_steps": 2,
            "batch_size": 1,
            "logging_steps": 1,
            "save_steps": 100,
            "learning_rate": 5e-2,
            "warmup_ratio": 0.0,
        },
    )
    job = write_job(tmp_path, tiny_model, stage, tmp_path / "prompts.jsonl", workers=2)
    done = run(torchrun_command(job, 2), tmp_path)
    assert done.returncode == 0, (tmp_path / "log.txt").read_text()[-4000:]
    assert status(tmp_path)["result"]["global_step"] == 2
    assert (tmp_path / "out" / "adapter" / "adapter_model.safetensors").exists()
    assert "trainable weights identical on all 2 ranks" in done.stdout
    assert "loss_kernel chunked" in done.stdout


def test_under_torchrun_the_watchdog_follows_the_launcher_not_the_parent(tmp_path):
    """A rank's parent is torchrun's agent, so the watchdog checks that the launcher's pid is alive: when the
    launcher (here a sleep) dies while the agent lives on, the rank is signalled as a cancel would."""
    launcher = subprocess.Popen(["sleep", "600"])
    code = (
        "import os, signal, time\n"
        "from dragon_dagster.engine.runtime.worker import watch_parent\n"
        "signal.signal(signal.SIGTERM, lambda *a: (print('stopping on SIGTERM', flush=True), os._exit(7)))\n"
        f"watch_parent({launcher.pid}, interval_s=0.1, grandparent=True)\n"
        "print('watching', flush=True)\n"
        "time.sleep(60)\n"
    )
    rank = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=worker_env())
    try:
        assert rank.stdout.readline().strip() == "watching"
        time.sleep(0.5)
        assert rank.poll() is None  # the launcher lives: the rank trains on although its parent is not it
        launcher.kill()
        launcher.wait()
        assert rank.wait(timeout=30) == 7
        assert "is gone; stopping" in rank.stdout.read()
    finally:
        for proc in (launcher, rank):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def group_alive(pgid: int) -> list[int]:
    """Pids still in the process group (zombies count as gone)."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            alive.append(int(stat.parent.name))
    return alive


def start_and_signal_after_two_steps(command: list[str], work: Path, **env) -> subprocess.Popen:
    """Start the command in a process group of its own (as the launchers do), SIGTERM the group once rank 0
    has logged two steps."""
    proc = start_after_two_steps(command, work, **env)
    os.killpg(proc.pid, signal.SIGTERM)  # what the launcher does on a cancelled run
    return proc


def start_after_two_steps(command: list[str], work: Path, **env) -> subprocess.Popen:
    """Start the command in a process group of its own (as the launchers do); return once rank 0 has logged
    two steps."""
    log = (work / "log.txt").open("w")
    proc = subprocess.Popen(
        command, cwd=work, env=worker_env(**env), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    log.close()
    rows = work / "out" / "progress.jsonl"
    deadline = time.monotonic() + 240
    while not (rows.exists() and len(rows.read_text().splitlines()) >= 2):
        assert proc.poll() is None and time.monotonic() < deadline, (work / "log.txt").read_text()[-4000:]
        time.sleep(0.1)
    return proc


def test_cancel_checkpoints_on_all_ranks_and_two_workers_resume(tiny_model, tickets, tmp_path):
    stage = sft_stage(max_steps=40)
    job = write_job(tmp_path, tiny_model, stage, tickets, workers=2)
    proc = start_after_two_steps(torchrun_command(job, 2), tmp_path)
    ranks = ranks_of(proc.pid)
    os.killpg(proc.pid, signal.SIGTERM)  # what the launcher does on a cancelled run
    proc.wait(timeout=120)  # torchrun's own exit code is 1 on a signal: the outcome says what happened
    text = (tmp_path / "log.txt").read_text()
    assert status(tmp_path)["event"] == "cancelled", text[-4000:]
    assert_gone(proc.pid, ranks)
    checkpoints = sorted((tmp_path / "ckpt").glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    assert checkpoints, text[-4000:]
    stopped = checkpoints[-1]
    assert checkpoint_problem(stopped) is None
    assert {"rng_state_0.pth", "rng_state_1.pth"} <= {p.name for p in stopped.iterdir()}  # each rank saved its own
    stopped_at = int(stopped.name.split("-")[1])
    assert 2 <= stopped_at < 40
    # both ranks stopped after the same step; torchrun's forward of the group's signal did not abort the save
    assert text.count(f"training cancelled at step {stopped_at};") == 2 and "stopped on signal" not in text

    resumed = write_job(tmp_path, tiny_model, stage, tickets, workers=2, resume_from=str(stopped))
    done = run(torchrun_command(resumed, 2), tmp_path)
    assert done.returncode == 0, (tmp_path / "log.txt").read_text()[-4000:]
    assert status(tmp_path)["result"]["global_step"] == 40
    trained = [r["step"] for r in progress(tmp_path) if r["elapsed_s"] is not None]
    assert min(trained) == stopped_at + 1 and max(trained) == 40  # picked up where it stopped


@pytest.mark.slow
def test_ray_train_workers_learn_what_torchrun_ranks_do(ray_head, sft_two, sft_root, tiny_model, tickets, tmp_path):
    job = write_job(tmp_path, tiny_model, sft_stage(), tickets, workers=2, backend="ray")
    done = run(
        [sys.executable, "-m", "dragon_dagster.engine.runtime.worker", str(job)],
        tmp_path,
        timeout=400,
        RAY_ADDRESS=ray_head.gcs_address,
    )  # the Ray job's entrypoint, as the launcher submits it
    log = (tmp_path / "log.txt").read_text()
    assert done.returncode == 0, log[-6000:]
    assert status(tmp_path)["event"] == "result" and status(tmp_path)["result"]["global_step"] == 6
    assert (tmp_path / "out" / "adapter" / "adapter_model.safetensors").exists()
    assert_same_curve(progress(tmp_path), progress(sft_root / "two"))
    # rank 0's lines reached the driver through the channel; rank 1's only through Ray's own log forwarding
    assert "trainable weights identical on all 2 ranks" in done.stdout
    assert "starting 2 Ray Train workers" in done.stdout
    assert "Started a local Ray instance" not in log  # it joined the cluster it was given

    # a stopped Ray job: SIGTERM to the driver's process tree; the ranks checkpoint, stop, and are gone
    again = tmp_path / "stopped"
    job = write_job(again, tiny_model, sft_stage(max_steps=400), tickets, workers=2, backend="ray")
    proc = start_and_signal_after_two_steps(
        [sys.executable, "-m", "dragon_dagster.engine.runtime.worker", str(job)],
        again,
        RAY_ADDRESS=ray_head.gcs_address,
    )
    assert proc.wait(timeout=120) == EXIT_CANCELLED, (again / "log.txt").read_text()[-4000:]
    assert status(again)["event"] == "cancelled"
    stopped = sorted((again / "ckpt").glob("checkpoint-*"))
    assert len(stopped) == 1 and checkpoint_problem(stopped[0]) is None
    deadline = time.monotonic() + 30
    while ray_head.train_processes() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not ray_head.train_processes()


def test_a_rank_that_dies_ends_the_whole_group_soon(tiny_model, tickets, tmp_path):
    """A rank killed mid-run (out of memory, a lost GPU): the others do not wait for it, although a cancel may
    take the launcher's whole termination timeout (600 s) to save its checkpoint."""
    job = write_job(tmp_path, tiny_model, sft_stage(max_steps=400), tickets, workers=2)
    proc = start_after_two_steps(torchrun_command(job, 2), tmp_path)
    ranks = ranks_of(proc.pid)
    started = time.monotonic()
    os.kill(ranks[1], signal.SIGKILL)
    assert proc.wait(timeout=120) != 0
    assert time.monotonic() - started < 90, "rank 0 waited on its dead peer"
    assert_gone(proc.pid, ranks)


def test_a_rank_whose_agent_is_killed_stops(tiny_model, tickets, tmp_path):
    """torchrun starts the ranks in sessions of their own: a SIGKILL to the launcher's group (a terminate
    that outlived termination_timeout_s) kills the agent only. The ranks see it and stop."""
    job = write_job(tmp_path, tiny_model, sft_stage(max_steps=5000), tickets, workers=2)
    proc = start_after_two_steps(torchrun_command(job, 2), tmp_path, **{PARENT_PID: str(os.getpid())})
    ranks = ranks_of(proc.pid)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert_gone(proc.pid, ranks, timeout=30)
    assert "is gone; stopping" in (tmp_path / "log.txt").read_text()


def ranks_of(agent: int) -> dict[int, int]:
    """{local rank: pid} of torchrun's ranks (its children, each in a session of its own)."""
    ranks = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) != agent:
                continue
            env = (stat.parent / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError):
            continue
        local = [e for e in env if e.startswith(b"LOCAL_RANK=")]
        if local:
            ranks[int(local[0].split(b"=")[1])] = int(stat.parent.name)
    assert sorted(ranks) == [0, 1], ranks
    return ranks


def assert_gone(agent: int, ranks: dict[int, int], timeout: float = 10) -> None:
    """No rank and no agent left (zombies count as gone)."""

    def left() -> list[int]:
        return [*group_alive(agent), *(pid for pid in ranks.values() if alive(pid))]

    deadline = time.monotonic() + timeout
    while left() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left()


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
