"""The `ray` launcher against a real Ray head that the test starts on 127.0.0.1 (and stops, processes and all)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import seed_mlflow_store, wait_until, workers, write_pipeline

pytestmark = pytest.mark.slow
TRAIN = [["tiny", "tickets"], ["tiny", "sft_dataset"], ["tiny", "sft_adapter"]]


def workers_on(runs: Path) -> list[int]:
    """Live worker processes whose job file lies under runs."""
    return workers(str(runs))


def ray_resources(runs: Path, head, **training) -> dict:
    from dragon_dagster.resources import ArtifactStore, MLflowTracking, TrainingResource

    return {
        "store": ArtifactStore(runs_dir=str(runs)),
        "tracking": MLflowTracking(runs_dir=str(runs)),
        "training": TrainingResource(device="cpu", launcher="ray", ray_address=head.address, **training),
    }


def test_a_stage_trains_as_a_ray_job_and_its_metrics_reach_mlflow_through_pipes(tiny_model, tmp_path, ray_head):
    from dagster import AssetSelection, DagsterInstance, materialize
    from mlflow import MlflowClient

    from dragon_dagster.assets.factory import build_pipeline_defs
    from dragon_dagster.engine.pipeline import load

    pipeline = load(write_pipeline(tmp_path / "defs", tiny_model))
    runs = tmp_path / "runs"
    instance = DagsterInstance.ephemeral()
    result = materialize(
        build_pipeline_defs(pipeline)["assets"],
        instance=instance,
        resources=ray_resources(runs, ray_head),
        selection=AssetSelection.assets(*TRAIN),
    )
    assert result.success
    [job] = [j for j in ray_head.client().list_jobs() if (j.metadata or {}).get("dagster/run-id") == result.run_id]
    assert job.status == "SUCCEEDED" and job.submission_id.startswith("dragon-"), job
    assert "dragon_dagster.engine.runtime.worker" in job.entrypoint
    # the run says where its worker ran, for the run launcher's health check; the finished job reads as gone
    from dragon_dagster.resources.launchers.base import recorded_workers
    from dragon_dagster.resources.launchers.ray import RayLauncher

    where = recorded_workers(instance.get_run_by_id(result.run_id).tags)["tiny__sft_adapter"]
    assert where == {"launcher": "ray", "address": ray_head.address, "job_id": job.submission_id}
    assert RayLauncher.worker_state(where) == "gone"
    [adapter] = list((runs / "artifacts" / "tiny" / "sft_adapter").iterdir())
    manifest = json.loads((adapter / "manifest.json").read_text())
    assert manifest["result"]["global_step"] == 8

    client = MlflowClient(f"sqlite:///{runs / 'mlflow.db'}")
    [run] = client.search_runs(  # the stage's run (its Dagster run's own run is its parent)
        [client.get_experiment_by_name("tiny").experiment_id], "tags.stage = 'sft_adapter'"
    )
    losses = client.get_metric_history(run.info.run_id, "train/loss")
    assert {2, 4, 6, 8} <= {m.step for m in losses}  # every logged step came back over the job's log
    assert run.info.status == "FINISHED"


DRIVER = """\
import sys
from dagster import AssetSelection, DagsterInstance, materialize
from dragon_dagster.assets.factory import build_pipeline_defs
from dragon_dagster.engine.pipeline import load
from dragon_dagster.resources import ArtifactStore, MLflowTracking, TrainingResource

spec, runs, home, address, resume = sys.argv[1:6]
resources = {"store": ArtifactStore(runs_dir=runs), "tracking": MLflowTracking(runs_dir=runs),
             "training": TrainingResource(device="cpu")}  # the deployment's default: subprocess
# this run goes to the Ray cluster: the launcher is overridden per run, as the launchpad does
ray = {"launcher": "ray", "ray_address": address, "termination_timeout_s": 60}
selection = [["tiny", "tickets"], ["tiny", "sft_dataset"], ["tiny", "sft_adapter"]]
result = materialize(build_pipeline_defs(load(spec))["assets"], instance=DagsterInstance.local_temp(home),
                     resources=resources, selection=AssetSelection.assets(*selection), raise_on_error=False,
                     run_config={"ops": {"tiny__sft_adapter": {"config": {"resume": resume == "resume"}}},
                                 "resources": {"training": {"config": ray}}})
print("SUCCESS" if result.success else "FAILED", flush=True)
"""
LONG_ARGS = (
    "{max_steps: 60, batch_size: 2, grad_accum: 1, logging_steps: 1, save_steps: 1000, "
    "max_seq_len: 128, learning_rate: 1.0e-3}"
)


def test_the_run_launcher_sees_and_stops_a_ray_job_whose_run_is_gone(ray_head):
    from dragon_dagster.resources.launchers.ray import RayLauncher

    job_id = ray_head.client().submit_job(entrypoint="python -c 'import time; time.sleep(300)'")
    where = {"launcher": "ray", "address": ray_head.address, "job_id": job_id}
    wait_until(lambda: RayLauncher.worker_state(where) == "running", 120, "the Ray job to run")
    assert RayLauncher.stop_worker(where) == f"stopped Ray job {job_id} at {ray_head.address}"
    wait_until(lambda: RayLauncher.worker_state(where) == "gone", 60, "the Ray job to stop")
    assert ray_head.client().get_job_status(job_id) == "STOPPED"
    assert RayLauncher.worker_state({**where, "address": "http://127.0.0.1:9"}) == "unknown"  # nothing there


def test_terminating_the_run_stops_the_ray_job_at_a_checkpoint_and_resume_continues(tiny_model, tmp_path, ray_head):
    spec = write_pipeline(tmp_path / "defs", tiny_model, args=LONG_ARGS)
    runs, home, driver = tmp_path / "runs", tmp_path / "home", tmp_path / "driver.py"
    home.mkdir()
    seed_mlflow_store(runs / "mlflow.db")  # the driver processes track into it: its tables made once
    driver.write_text(DRIVER)
    client = ray_head.client()
    before = {j.submission_id for j in client.list_jobs()}

    def launch(mode: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, str(driver), str(spec), str(runs), str(home), ray_head.address, mode],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=Path(__file__).parents[3],  # the repository's root
        )

    run = launch("fresh")

    def progress() -> list[str]:
        return [
            line
            for f in runs.glob("artifacts/tiny/sft_adapter/.tmp-*/progress.jsonl")
            for line in f.read_text().splitlines()
        ]

    def driver_exited() -> str | None:
        return None if run.poll() is None else f"the driver exited with {run.returncode}:\n{run.stdout.read()[-3000:]}"

    # the trainer is under way on the Ray cluster
    wait_until(lambda: len(progress()) >= 3, 180, "training to get going (3 logged steps)", alive=driver_exited)
    assert workers_on(runs), "the worker runs as the Ray job's entrypoint"
    [job] = [j for j in client.list_jobs() if j.submission_id not in before]
    run.send_signal(signal.SIGINT)  # what terminating a run does to its step: Dagster raises an interrupt
    out, _ = run.communicate(timeout=180)
    assert "FAILED" in out, out[-3000:]
    assert client.get_job_status(job.submission_id) == "STOPPED"
    assert not workers_on(runs), "a worker outlived its stopped Ray job"
    checkpoints = list((runs / "checkpoints" / "tiny" / "sft_adapter").glob("*/checkpoint-*"))
    assert len(checkpoints) == 1, "the stopped trainer saved one checkpoint where it stopped"
    stopped_at = int(checkpoints[0].name.split("-")[1])
    assert 3 <= stopped_at < 60

    out, _ = launch("resume").communicate(timeout=400)
    assert "SUCCESS" in out, out[-3000:]
    [adapter] = list((runs / "artifacts" / "tiny" / "sft_adapter").iterdir())
    rows = [json.loads(line) for line in (adapter / "progress.jsonl").read_text().splitlines()]
    trained = [r["step"] for r in rows if r["elapsed_s"] is not None]
    assert min(trained) > stopped_at and max(trained) == 60  # it continued where it stopped


def test_two_workers_train_one_stage_with_ray_train_and_report_as_one(tiny_model, tmp_path, ray_head):
    from dagster import AssetSelection, DagsterInstance, materialize
    from mlflow import MlflowClient

    from dragon_dagster.assets.factory import build_pipeline_defs
    from dragon_dagster.engine.pipeline import load

    pipeline = load(write_pipeline(tmp_path / "defs", tiny_model))
    runs = tmp_path / "runs"
    result = materialize(
        build_pipeline_defs(pipeline)["assets"],
        instance=DagsterInstance.ephemeral(),
        resources=ray_resources(runs, ray_head, workers=2),
        selection=AssetSelection.assets(*TRAIN),
    )
    assert result.success
    [adapter] = list((runs / "artifacts" / "tiny" / "sft_adapter").iterdir())
    manifest = json.loads((adapter / "manifest.json").read_text())
    assert manifest["result"]["global_step"] == 8 and (adapter / "adapter" / "adapter_model.safetensors").exists()
    job = json.loads((adapter / "job.json").read_text())
    assert job["parallel"] == {
        "workers": 2,
        "backend": "ray",
        "cpus_per_worker": 1.0,
        "gpus_per_worker": 0.0,
        "memory_gb_per_worker": 0.0,
    }
    client = MlflowClient(f"sqlite:///{runs / 'mlflow.db'}")
    [run] = client.search_runs(  # the stage's run (its Dagster run's own run is its parent)
        [client.get_experiment_by_name("tiny").experiment_id], "tags.stage = 'sft_adapter'"
    )
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")]
    assert {2, 4, 6, 8} <= set(steps) and len(steps) == len(set(steps))  # rank 0 alone reported, once a step
    assert not workers_on(runs)
