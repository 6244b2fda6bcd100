"""A real Dagster webserver and daemon on loopback (`dagster dev`, as `make ui` runs it): launch a materialization
through GraphQL, terminate the run while it trains (the trainer saves a checkpoint and stops), then launch again
with resume: true."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from dragon_dagster.cli import PROJECT_DAGSTER_YAML
from tests.support import (
    free_port,
    healthy,
    launcher_of,
    seed_mlflow_store,
    user_project,
    wait_until,
    workers,
    write_pipeline,
)

pytestmark = pytest.mark.slow

LAUNCH = """
mutation Launch($params: ExecutionParams!) {
  launchRun(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message }
    ... on RunConfigValidationInvalid { errors { message } }
    ... on InvalidSubsetError { message }
  }
}"""
STATUS = """query Status($runId: ID!) { runOrError(runId: $runId) { ... on Run { status } } }"""
TERMINATE = """mutation Stop($runId: String!) { terminateRun(runId: $runId) { __typename
  ... on TerminateRunFailure { message } ... on PythonError { message } } }"""
SHIPPED_DAGSTER_YAML = PROJECT_DAGSTER_YAML.read_text()
LOCATIONS = """{ repositoriesOrError { ... on RepositoryConnection { nodes { name location { name } } } } }"""


class Webserver:
    def __init__(
        self,
        root: Path,
        project: Path,
        module: str = "trainlab.definitions",
        location: str = "trainlab",
        dagster_yaml: str = SHIPPED_DAGSTER_YAML,
        program: tuple[str, ...] = ("dagster", "dev"),
        env: dict[str, str] | None = None,
    ):
        """A `dagster dev` on root/dagster_home (again, if an earlier one used it: its runs are still there);
        program=("dagster-webserver",) starts the webserver alone (a daemon of its own then dequeues the runs). env:
        more environment variables for it."""
        self.port = free_port()
        seed_mlflow_store(root / "runs" / "mlflow.db")  # its run processes' MLflow store, its tables made once
        self.home = home = root / "dagster_home"
        home.mkdir(exist_ok=True)
        (home / "dagster.yaml").write_text(dagster_yaml)
        env = {
            **os.environ,
            "DAGSTER_HOME": str(home),
            "PYTHONPATH": str(project),
            "DRAGON_RUNS_DIR": str(root / "runs"),
            "HF_HUB_OFFLINE": "1",
            **(env or {}),
        }
        self.env = env
        (project / "workspace.yaml").write_text(  # the location named as the project's pyproject names it
            f"load_from:\n  - python_module: {{module_name: {module}, working_directory: ., "
            f"location_name: {location}}}\n"
        )
        self.log = open(root / "webserver.log", "a")
        # dagster dev = webserver + daemon; the daemon dequeues launched runs (QueuedRunCoordinator)
        self.program = " ".join(program)
        self.proc = subprocess.Popen(
            [
                str(Path(sys.executable).parent / program[0]),
                *program[1:],
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-w",
                "workspace.yaml",
            ],
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            cwd=project,
            start_new_session=True,
        )
        self.url = f"http://127.0.0.1:{self.port}/graphql"
        self.root = root
        try:
            wait_until(
                lambda: healthy(f"http://127.0.0.1:{self.port}/server_info"),
                120,
                "the webserver to start",
                alive=self.gone,
            )
        except BaseException:  # pytest.fail included: dagster dev does not outlive a failed start
            self.stop()
            raise

    def tail(self) -> str:
        return (self.root / "webserver.log").read_text()[-3000:]

    def gone(self) -> str | None:
        """Why waiting on this server is pointless: its process exited (with the log's tail), else None."""
        code = self.proc.poll()
        return None if code is None else f"{self.program} exited with {code}:\n{self.tail()}"

    def gql(self, query: str, **variables) -> dict:
        response = requests.post(self.url, json={"query": query, "variables": variables}, timeout=60)
        response.raise_for_status()
        body = response.json()
        assert "errors" not in body, body
        return body["data"]

    def launch(self, job: str, assets: list[list[str]] | None, run_config: dict, checks: list | None = None) -> str:
        """Launch job's run (of assets, with their checks unless checks names which: [] for none); its id."""
        repo = next(n for n in self.gql(LOCATIONS)["repositoriesOrError"]["nodes"])
        selector = {
            "repositoryLocationName": repo["location"]["name"],
            "repositoryName": repo["name"],
            "pipelineName": job,
        }
        if assets:
            selector["assetSelection"] = [{"path": a} for a in assets]
        if checks is not None:
            selector["assetCheckSelection"] = checks
        result = self.gql(LAUNCH, params={"selector": selector, "runConfigData": run_config})["launchRun"]
        assert result["__typename"] == "LaunchRunSuccess", result
        return result["run"]["runId"]

    def status(self, run_id: str) -> str:
        return self.gql(STATUS, runId=run_id)["runOrError"]["status"]

    def wait(self, run_id: str, timeout: float = 300) -> str:
        def ended() -> str | None:
            status = self.status(run_id)
            return status if status in ("SUCCESS", "FAILURE", "CANCELED") else None

        return wait_until(ended, timeout, f"run {run_id} to end", alive=self.gone, every=1)

    def crash(self):
        """What an out-of-memory kill, a crash or a reboot does: the whole process group dies at once (-9)."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.log.close()

    def stop(self):
        if self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.log.close()


def test_launch_terminate_and_resume_through_graphql(tiny_model, tmp_path):
    # long enough that the terminate lands mid-training: a warm-started worker trains the tiny model at several
    # steps a second, and the terminate takes seconds to travel (webserver, run process, step, worker)
    long_args = (
        "{max_steps: 400, batch_size: 2, grad_accum: 1, logging_steps: 1, save_steps: 1000, "
        "max_seq_len: 128, learning_rate: 1.0e-3}"
    )
    defs = user_project(tmp_path / "project")
    write_pipeline(defs, tiny_model, args=long_args)
    server = Webserver(tmp_path, tmp_path / "project")
    runs = tmp_path / "runs"
    try:
        run_id = server.launch(
            "tiny_pipeline", [["tiny", "tickets"], ["tiny", "sft_dataset"], ["tiny", "sft_adapter"]], {}
        )

        # wait until the trainer has logged a few steps, then terminate the run as the UI's button does
        def progress() -> list[str]:
            return [
                line
                for f in runs.glob("artifacts/tiny/sft_adapter/.tmp-*/progress.jsonl")
                for line in f.read_text().splitlines()
            ]

        def run_ended() -> str | None:
            status = server.status(run_id)
            if status in ("QUEUED", "NOT_STARTED", "STARTING", "STARTED"):
                return server.gone()
            return f"the run is {status} before training got going:\n{server.tail()}"

        wait_until(
            lambda: len(progress()) >= 3, 240, "training to get going (3 logged steps)", alive=run_ended, every=0.5
        )
        stop = server.gql(TERMINATE, runId=run_id)["terminateRun"]
        assert stop["__typename"] == "TerminateRunSuccess", stop
        assert server.wait(run_id, timeout=180) == "CANCELED"
        checkpoints = list((runs / "checkpoints" / "tiny" / "sft_adapter").glob("*/checkpoint-*"))
        assert len(checkpoints) == 1, "the cancelled trainer saved one checkpoint where it stopped"
        stopped_at = int(checkpoints[0].name.split("-")[1])
        assert 3 <= stopped_at < 400
        assert not list(runs.glob("artifacts/tiny/sft_adapter/*")), "no artifact for a cancelled stage"

        resume_config = {"ops": {"tiny__sft_adapter": {"config": {"resume": True}}}}  # same schedule, 400 steps
        run_id = server.launch("tiny_pipeline", [["tiny", "sft_adapter"]], resume_config)
        assert server.wait(run_id, timeout=400) == "SUCCESS"
        [adapter] = list(runs.glob("artifacts/tiny/sft_adapter/*"))
        rows = [json.loads(line) for line in (adapter / "progress.jsonl").read_text().splitlines()]
        trained = [r["step"] for r in rows if r["elapsed_s"] is not None]
        assert min(trained) > stopped_at and max(trained) == 400  # it continued where it stopped
        assert rows[0]["step"] == 1  # and the adapter's progress keeps the steps before the checkpoint
        manifest = json.loads((adapter / "manifest.json").read_text())
        assert manifest["result"]["global_step"] == 400

        from mlflow import MlflowClient

        client = MlflowClient(f"sqlite:///{runs / 'mlflow.db'}")
        experiment = client.get_experiment_by_name("tiny")
        stage_runs = client.search_runs([experiment.experiment_id], "tags.stage = 'sft_adapter'")
        assert sorted(r.info.status for r in stage_runs) == ["FINISHED", "KILLED"]
        parents = client.search_runs([experiment.experiment_id], "tags.level = 'pipeline'")  # one per Dagster run
        assert sorted(r.info.status for r in parents) == ["FINISHED", "KILLED"]

        studio_launches_through_the_webserver(server, defs, runs, tiny_model, tmp_path)
    finally:
        server.stop()


def studio_launches_through_the_webserver(server, defs: Path, runs: Path, tiny_model, tmp_path):
    """The studio writes a new pipeline into the project the webserver serves and runs it there (issue 43): the
    code location is reloaded so the job exists, the run goes through the webserver's queue, its steps are read
    back through GraphQL, and the studio's cancel terminates it there."""
    import pandas as pd

    from dragon_dagster.studio import Studio

    pd.DataFrame(
        {"q": [f"Lamp {i} blinks after update {i}" for i in range(40)], "a": [f"Reset lamp {i}." for i in range(40)]}
    ).to_csv(tmp_path / "lamps.csv", index=False)
    studio = Studio(defs, runs, str(tiny_model), dagster_url=f"http://127.0.0.1:{server.port}")
    values = [str(tmp_path / "lamps.csv"), "lamps", "", "auto", "", "q", "a", "", "", "supervised", 2000, 2.0e-4, 4, 2]
    _, saved = studio.save(*values, None, ["contains"])
    assert saved.startswith("Wrote"), saved
    started = studio.launch("lamps")
    assert f"the Dagster webserver at http://127.0.0.1:{server.port}" in started, started
    wait_until(lambda: len(studio.loss_rows("lamps")) >= 3, 240, "the studio's run to train", alive=server.gone)
    launched = studio.runs["lamps"].launched
    assert server.status(launched.run_id) == "STARTED"  # the webserver's own record of the studio's run
    assert any(s.stage == "lamps/sft_adapter" and s.status == "RUNNING" for s in launched.steps())
    studio.cancel("lamps")
    assert server.wait(launched.run_id, timeout=180) == "CANCELED"
    _, _, status = studio.follow("lamps")
    assert status.startswith("**CANCELED**") and f"/runs/{launched.run_id}" in status


# ------------------------------------------------------------------------ workers never outlive their job

LONG_ARGS = (
    "{max_steps: 400, batch_size: 2, grad_accum: 1, logging_steps: 1, save_steps: 1000, "
    "max_seq_len: 128, learning_rate: 1.0e-3}"
)
TRAIN = [["tiny", "tickets"], ["tiny", "sft_dataset"], ["tiny", "sft_adapter"]]


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def recorded_run_process(server, run_id: str) -> int:
    """The run worker's pid as Dagster recorded it (the run launcher's health check reads the same event)."""
    from dagster import DagsterInstance

    from dragon_dagster.resources.run_launcher import run_process

    with DagsterInstance.from_config(str(server.home)) as instance:
        pid, _ = run_process(instance, instance.get_run_by_id(run_id))
    assert pid is not None, server.tail()
    return pid


def wait_for(predicate, timeout: float, what: str, server):
    """wait_until, failing at once (with the log's tail) if the server died meanwhile."""
    return wait_until(predicate, timeout, what, alive=server.gone, every=0.5)


@pytest.fixture()
def training_server(tiny_model, tmp_path):
    defs = user_project(tmp_path / "project")
    write_pipeline(defs, tiny_model, args=LONG_ARGS)
    server = Webserver(tmp_path, tmp_path / "project")
    yield server
    server.stop()


def start_training(server) -> tuple[str, int]:
    """Launch the long SFT; return the run id and the worker's pid once it has logged a step."""
    run_id = server.launch("tiny_pipeline", TRAIN, {})
    runs = server.root / "runs"
    wait_for(
        lambda: any(f.read_text().strip() for f in runs.glob("artifacts/tiny/sft_adapter/.tmp-*/progress.jsonl")),
        300,
        "training to log a step",
        server,
    )
    [worker] = workers(str(runs / "artifacts" / "tiny" / "sft_adapter"))
    return run_id, worker


def mlflow_statuses(runs: Path) -> list[str]:
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{runs / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("tiny")
    return sorted(r.info.status for r in client.search_runs([experiment.experiment_id], "tags.stage = 'sft_adapter'"))


def test_a_killed_step_process_leaves_no_worker_and_gives_the_pool_slot_back(training_server):
    server, runs = training_server, training_server.root / "runs"
    run_id, worker = start_training(server)
    step = launcher_of(worker)
    os.kill(step, signal.SIGKILL)
    wait_for(lambda: not alive(worker), 30, "the worker to stop with its step process", server)
    assert server.wait(run_id, timeout=120) == "FAILURE"
    # run monitoring gives the dead step's `training` slot back; without it this run would wait for ever
    quick = {"ops": {"tiny__sft_adapter": {"config": {"args": {"max_steps": 2}}}}}
    again = server.launch("tiny_pipeline", [["tiny", "sft_adapter"]], quick)
    assert server.wait(again, timeout=400) == "SUCCESS", (server.root / "webserver.log").read_text()[-3000:]
    assert mlflow_statuses(runs) == ["FINISHED", "KILLED"]  # the dead job's run is closed, not left RUNNING
    assert not workers(str(runs))


def test_a_killed_run_process_stops_its_step_and_worker_and_records_nothing(training_server):
    server, runs = training_server, training_server.root / "runs"
    run_id, worker = start_training(server)
    step = launcher_of(worker)
    run_process = recorded_run_process(server, run_id)
    # steps are forked by the run's forkserver (the pool executor's start method), which ends with the run process
    forkserver = parent_of(step)
    assert forkserver != run_process and parent_of(forkserver) == run_process
    os.kill(run_process, signal.SIGKILL)
    wait_for(lambda: not alive(worker), 60, "the worker to stop after the run process died", server)
    wait_for(lambda: not alive(step), 60, "the step process to end", server)
    wait_for(lambda: not alive(forkserver), 30, "the run's forkserver to end after its last step", server)
    assert server.status(run_id) == "FAILURE"  # marked by the step that saw its run process die
    assert not [p for p in (runs / "artifacts" / "tiny" / "sft_adapter").iterdir() if not p.name.startswith(".tmp-")]
    assert mlflow_statuses(runs) == ["FAILED"]


# A Dagster killed with its runs (docs/operations/operating.md states the bound): the run monitoring pass after
# `dagster dev` is up again fails the dead run (poll_interval_seconds: 10), the queued run then starts.
DEAD_RUN_FAILED_WITHIN_S = 120
MONITORING_OFF = SHIPPED_DAGSTER_YAML.replace("run_monitoring:\n  enabled: true", "run_monitoring:\n  enabled: false")


def training_worker(server, run_id: str) -> int:
    """The pid of run_id's SFT worker once it has logged a step."""
    progress = f"artifacts/tiny/sft_adapter/.tmp-*.run-{run_id}.*/progress.jsonl"
    wait_for(
        lambda: any(f.read_text().strip() for f in (server.root / "runs").glob(progress)),
        300,
        f"run {run_id} to train a step",
        server,
    )
    [worker] = workers(str(server.root / "runs" / "artifacts" / "tiny" / "sft_adapter"))
    return worker


def run_messages(server, run_id: str, event_type) -> list[str]:
    from dagster import DagsterInstance

    with DagsterInstance.from_config(str(server.home)) as instance:
        return [entry.message for entry in instance.all_logs(run_id, of_type={event_type})]


def test_a_dagster_that_died_with_its_runs_ends_them_when_it_is_back(tiny_model, tmp_path):
    from dagster import DagsterEventType

    project = tmp_path / "project"
    write_pipeline(user_project(project), tiny_model, args=LONG_ARGS)
    server = Webserver(tmp_path, project)
    try:
        first = server.launch("tiny_pipeline", TRAIN, {})
        worker = training_worker(server, first)
        second = server.launch("tiny_pipeline", [["tiny", "sft_adapter"]], {})
        wait_for(lambda: server.status(second) == "QUEUED", 60, "the second training run to queue", server)
        server.crash()
        wait_until(lambda: not alive(worker), 30, "the orphaned worker to stop by itself")

        # back without run monitoring: the dead run still reads STARTED; a plain Terminate ends it at once
        server = Webserver(tmp_path, project, dagster_yaml=MONITORING_OFF)
        assert server.status(first) == "STARTED"
        asked = time.monotonic()
        stop = server.gql(TERMINATE, runId=first)["terminateRun"]
        assert stop["__typename"] == "TerminateRunSuccess", stop
        assert server.wait(first, timeout=30) == "CANCELED"
        assert time.monotonic() - asked < 30
        [canceled] = run_messages(server, first, DagsterEventType.RUN_CANCELED)
        assert "Canceled at once: the run process" in canceled and "is gone" in canceled

        # the pool is free: the queued run trains; Dagster dies again, a third training run waiting behind it
        worker = training_worker(server, second)
        quick = {"ops": {"tiny__sft_adapter": {"config": {"args": {"max_steps": 2}}}}}
        third = server.launch("tiny_pipeline", [["tiny", "sft_adapter"]], quick)
        wait_for(lambda: server.status(third) == "QUEUED", 60, "the third training run to queue", server)
        server.crash()
        wait_until(lambda: not alive(worker), 30, "the orphaned worker to stop by itself")

        # back as shipped: run monitoring fails the dead run within the bound, and the queued one starts
        server = Webserver(tmp_path, project)
        up = time.monotonic()
        assert server.wait(second, timeout=DEAD_RUN_FAILED_WITHIN_S) == "FAILURE"
        print(f"dead run failed {time.monotonic() - up:.0f} s after dagster dev was up again")
        [failure] = run_messages(server, second, DagsterEventType.RUN_FAILURE)
        assert "the run process (pid" in failure and "Dagster stopped with it" in failure, failure
        started = wait_for(
            lambda: (status := server.status(third)) not in ("QUEUED", "NOT_STARTED") and status,
            60,
            "the queued training run to start",
            server,
        )
        assert started in ("STARTING", "STARTED", "SUCCESS"), (started, server.tail())
    finally:
        server.stop()


def test_terminating_a_run_stops_a_synthesis_worker_at_once(tiny_model, tmp_path, stub):
    hung = stub(lambda n, body: (time.sleep(120), (200, {}))[1])  # a teacher that never answers in time
    defs = user_project(tmp_path / "project")
    (defs / "hang").mkdir()
    (defs / "hang" / "defs.yaml").write_text(
        "type: dragon_dagster.PostTrainingPipeline\nattributes:\n"
        f"  name: hang\n  model: {tiny_model}\n  datasets: {{tickets: {{path: 'example:tickets.csv'}}}}\n"
        "  stages:\n"
        "    - {name: sft_dataset, kind: chat_dataset, source: tickets, prompt: '{subject}', response: reply}\n"
        "    - {name: teacher_rows, kind: synthetic_dataset, dataset: sft_dataset,\n"
        f"       teacher: {{base_url: '{hung.url}', model: t, timeout: 600, retries: 0}}}}\n"
    )
    server = Webserver(tmp_path, tmp_path / "project")
    try:
        run_id = server.launch(
            "hang_pipeline", [["hang", "tickets"], ["hang", "sft_dataset"], ["hang", "teacher_rows"]], {}
        )
        wait_for(lambda: hung.requests, 300, "the worker to call the teacher", server)
        [worker] = workers(str(tmp_path / "runs" / "artifacts" / "hang" / "teacher_rows"))
        stop = server.gql(TERMINATE, runId=run_id)["terminateRun"]
        assert stop["__typename"] == "TerminateRunSuccess", stop
        stopped = time.time()
        wait_for(lambda: not alive(worker), 20, "the synthesis worker to stop", server)
        assert time.time() - stopped < 20
        assert server.wait(run_id, timeout=60) == "CANCELED"
        assert not [
            p
            for p in (tmp_path / "runs" / "artifacts" / "hang" / "teacher_rows").iterdir()
            if not p.name.startswith(".tmp-")
        ]
    finally:
        server.stop()
