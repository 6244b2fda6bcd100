"""The `ray` launcher against a real Ray head that the test starts on 127.0.0.1 (and stops, processes and all)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from .conftest import closed_port, write_pipeline

pytestmark = pytest.mark.slow
TRAIN = [["tiny", "tickets"], ["tiny", "sft_dataset"], ["tiny", "sft_adapter"]]


class RayHead:
    """`ray start --head` on loopback with its own temp dir; stop() kills every process that names that dir
    (`ray stop` would stop any other Ray on the machine too)."""

    def __init__(self, root: Path):
        self.temp = Path(f"/tmp/ray-{os.getpid()}-{closed_port()}")  # short: Ray's unix sockets live under it
        self.port, self.dashboard_port = closed_port(), closed_port()
        self.address = f"http://127.0.0.1:{self.dashboard_port}"
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
        ray = Path(sys.executable).with_name("ray")
        out = subprocess.run([str(ray), "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(self.port),
                              "--dashboard-host", "127.0.0.1", "--dashboard-port", str(self.dashboard_port),
                              "--num-cpus", "2", "--temp-dir", str(self.temp), "--disable-usage-stats"],
                             env=env, capture_output=True, text=True, timeout=180, cwd=root)
        if out.returncode != 0:
            self.stop()
            pytest.fail(f"ray start failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")

    def client(self):
        from ray.job_submission import JobSubmissionClient

        return JobSubmissionClient(self.address)

    def processes(self) -> list[int]:
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if str(self.temp).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.append(int(pid))
            except OSError:
                pass
        return found

    def stop(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in self.processes():
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            time.sleep(2)


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory):
    head = RayHead(tmp_path_factory.mktemp("ray"))
    yield head
    head.stop()


def ray_resources(runs: Path, head: RayHead, **training) -> dict:
    from dragon_dagster.resources import ArtifactStore, MLflowTracking, TrainingResource

    return {"store": ArtifactStore(runs_dir=str(runs)), "tracking": MLflowTracking(runs_dir=str(runs)),
            "training": TrainingResource(device="cpu", launcher="ray", ray_address=head.address, **training)}


def test_a_stage_trains_as_a_ray_job_and_its_metrics_reach_mlflow_through_pipes(tiny_model, tmp_path, ray_head):
    from dagster import AssetSelection, DagsterInstance, materialize
    from mlflow import MlflowClient

    from dragon_dagster.assets.factory import build_pipeline_defs
    from dragon_dagster.engine.spec.pipeline import load

    pipeline = load(write_pipeline(tmp_path / "defs", tiny_model))
    runs = tmp_path / "runs"
    result = materialize(build_pipeline_defs(pipeline)["assets"], instance=DagsterInstance.ephemeral(),
                         resources=ray_resources(runs, ray_head), selection=AssetSelection.keys(*TRAIN))
    assert result.success
    [job] = [j for j in ray_head.client().list_jobs() if j.submission_id and j.submission_id.startswith("dragon-")]
    assert job.status == "SUCCEEDED", job
    assert job.metadata.get("dagster/run-id") == result.run_id, job.metadata
    assert "dragon_dagster.engine.worker" in job.entrypoint
    [adapter] = list((runs / "artifacts" / "tiny" / "sft_adapter").iterdir())
    manifest = json.loads((adapter / "manifest.json").read_text())
    assert manifest["result"]["global_step"] == 8

    client = MlflowClient(f"sqlite:///{runs / 'mlflow.db'}")
    [run] = client.search_runs([client.get_experiment_by_name("tiny").experiment_id])
    losses = client.get_metric_history(run.info.run_id, "train/loss")
    assert {2, 4, 6, 8} <= {m.step for m in losses}  # every logged step came back over the job's log
    assert run.info.status == "FINISHED"
