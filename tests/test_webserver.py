"""A real Dagster webserver and daemon on loopback (`dagster dev`, as `make ui` runs it): launch a materialization through GraphQL, terminate the run while
it trains (the trainer saves a checkpoint and stops), then launch again with resume: true."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from .conftest import user_project, write_pipeline

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
LOCATIONS = """{ repositoriesOrError { ... on RepositoryConnection { nodes { name location { name } } } } }"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Webserver:
    def __init__(self, root: Path, project: Path, module: str):
        self.port = free_port()
        home = root / "dagster_home"
        home.mkdir()
        (home / "dagster.yaml").write_text((Path(__file__).parent.parent / "dagster.yaml").read_text())
        env = {**os.environ, "DAGSTER_HOME": str(home), "PYTHONPATH": str(project),
               "DRAGON_RUNS_DIR": str(root / "runs"), "HF_HUB_OFFLINE": "1"}
        self.log = open(root / "webserver.log", "w")
        # dagster dev = webserver + daemon; the daemon dequeues launched runs (QueuedRunCoordinator)
        self.proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "dagster"), "dev", "-h", "127.0.0.1", "-p", str(self.port),
             "-m", module], env=env, stdout=self.log, stderr=subprocess.STDOUT, cwd=project,
            start_new_session=True)
        self.url = f"http://127.0.0.1:{self.port}/graphql"
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                if requests.get(f"http://127.0.0.1:{self.port}/server_info", timeout=2).ok:
                    break
            except requests.ConnectionError:
                time.sleep(1)
        else:
            raise RuntimeError(f"webserver did not start: {(root / 'webserver.log').read_text()[-2000:]}")

    def gql(self, query: str, **variables) -> dict:
        response = requests.post(self.url, json={"query": query, "variables": variables}, timeout=60)
        response.raise_for_status()
        body = response.json()
        assert "errors" not in body, body
        return body["data"]

    def launch(self, job: str, assets: list[list[str]] | None, run_config: dict) -> str:
        repo = next(n for n in self.gql(LOCATIONS)["repositoriesOrError"]["nodes"])
        selector = {"repositoryLocationName": repo["location"]["name"], "repositoryName": repo["name"],
                    "pipelineName": job}
        if assets:
            selector["assetSelection"] = [{"path": a} for a in assets]
        result = self.gql(LAUNCH, params={"selector": selector, "runConfigData": run_config})["launchRun"]
        assert result["__typename"] == "LaunchRunSuccess", result
        return result["run"]["runId"]

    def status(self, run_id: str) -> str:
        return self.gql(STATUS, runId=run_id)["runOrError"]["status"]

    def wait(self, run_id: str, timeout: float = 300) -> str:
        deadline = time.time() + timeout
        while time.time() < deadline:
            status = self.status(run_id)
            if status in ("SUCCESS", "FAILURE", "CANCELED"):
                return status
            time.sleep(1)
        raise TimeoutError(f"run {run_id} still {status}")

    def stop(self):
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.log.close()


def test_launch_terminate_and_resume_through_graphql(tiny_model, tmp_path):
    long_args = ("{max_steps: 400, batch_size: 2, grad_accum: 1, logging_steps: 1, save_steps: 1000, "
                 "max_seq_len: 128, learning_rate: 1.0e-3}")
    defs = user_project(tmp_path / "project")
    write_pipeline(defs, tiny_model, args=long_args)
    server = Webserver(tmp_path, tmp_path / "project", "trainlab.definitions")
    runs = tmp_path / "runs"
    try:
        run_id = server.launch("tiny_pipeline", [["tiny", "tickets"], ["tiny", "sft_dataset"], ["tiny", "sft_adapter"]],
                               {})
        # wait until the trainer has logged a few steps, then terminate the run as the UI's button does
        deadline = time.time() + 240
        progress = []
        while time.time() < deadline and len(progress) < 3:
            progress = [line for f in runs.glob("artifacts/tiny/sft_adapter/.tmp-*/progress.jsonl")
                        for line in f.read_text().splitlines()]
            assert server.status(run_id) in ("QUEUED", "NOT_STARTED", "STARTING", "STARTED"), (
                server.status(run_id), (tmp_path / "webserver.log").read_text()[-3000:])
            time.sleep(0.5)
        assert len(progress) >= 3, "training never got going"
        stop = server.gql(TERMINATE, runId=run_id)["terminateRun"]
        assert stop["__typename"] == "TerminateRunSuccess", stop
        assert server.wait(run_id, timeout=180) == "CANCELED"
        checkpoints = list((runs / "checkpoints" / "tiny" / "sft_adapter").glob("*/checkpoint-*"))
        assert len(checkpoints) == 1, "the cancelled trainer saved one checkpoint where it stopped"
        stopped_at = int(checkpoints[0].name.split("-")[1])
        assert 3 <= stopped_at < 400
        assert not list(runs.glob("artifacts/tiny/sft_adapter/*")), "no artifact for a cancelled stage"

        resume_config = {"ops": {"tiny__sft_adapter": {"config": {"resume": True,
                                                                "args": {"max_steps": stopped_at + 3}}}}}
        run_id = server.launch("tiny_pipeline", [["tiny", "sft_adapter"]], resume_config)
        assert server.wait(run_id, timeout=300) == "SUCCESS"
        [adapter] = list(runs.glob("artifacts/tiny/sft_adapter/*"))
        steps = [json.loads(line)["step"] for line in (adapter / "progress.jsonl").read_text().splitlines()]
        assert min(steps) > stopped_at and max(steps) == stopped_at + 3
        manifest = json.loads((adapter / "manifest.json").read_text())
        assert manifest["result"]["global_step"] == stopped_at + 3

        from mlflow import MlflowClient

        client = MlflowClient(f"sqlite:///{runs / 'mlflow.db'}")
        experiment = client.get_experiment_by_name("tiny")
        statuses = sorted(r.info.status for r in client.search_runs([experiment.experiment_id]))
        assert statuses == ["FINISHED", "KILLED"]
    finally:
        server.stop()
