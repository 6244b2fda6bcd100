"""The training resource: the speed settings reach trainer jobs only, and the worker's command per launcher
and number of workers."""

import json
import sys
from pathlib import Path

import pytest

from tests.support import sft_job as job


def test_training_resource_sends_speed_to_trainer_jobs_only(tmp_path, monkeypatch):
    from dagster import Failure, build_asset_context

    from dragon_dagster.engine.config.job import ModelInputs
    from dragon_dagster.engine.stages.merge.settings import Merge
    from dragon_dagster.engine.stages.merge.worker import MergeJob
    from dragon_dagster.resources import TrainingResource, training

    resource = TrainingResource(device="cpu", loss_kernel="trl", generation_batch_size=64, python=sys.executable)
    assert resource.speed().model_dump() == {
        "packing": "auto",
        "loss_kernel": "trl",
        "generation_batch_size": 64,
        "torch_compile": False,
        "unpad": "auto",
        "dropout_mask": "auto",
        "lora_product": "auto",
        "sampling": "auto",
    }
    missing = tmp_path / "no-model"  # the jobs name no model that exists: the worker fails, the job file stays
    launched = []

    class FailingWorker:  # a directly built asset context cannot open a Pipes session: the launch is stood in for
        def launch(self, context, resource, command, env, tap, parallel):
            launched.append(command[-1])
            return 1  # what the worker exits with when it cannot load the model

    monkeypatch.setitem(training.LAUNCHERS, "subprocess", FailingWorker)
    for kind in ("sft", "merge"):
        (tmp_path / kind).mkdir()
    jobs = {
        "sft": job(tmp_path / "sft", missing, missing / "train.jsonl", missing / "eval.jsonl"),
        "merge": MergeJob(
            settings=Merge(name="merged_model", kind="merge"),
            inputs=ModelInputs(model=str(missing)),
            output_dir=str(tmp_path / "merge"),
        ),
    }
    seen = {}
    for kind, typed in jobs.items():
        with pytest.raises(Failure, match=rf"the {kind} worker \(subprocess\) exited with code 1"):
            resource.run_job(build_asset_context(), typed, tmp_path / kind)
        seen[kind] = json.loads((tmp_path / kind / "job.json").read_text())
    assert seen["sft"]["speed"]["loss_kernel"] == "trl" and seen["merge"].get("speed") is None
    assert [Path(f).parent.name for f in launched] == ["sft", "merge"]  # each worker was given its own run file


def test_the_worker_command_per_launcher_and_workers(tmp_path):
    from dragon_dagster.resources import TrainingResource

    training = job(tmp_path, "model", tmp_path / "train.jsonl", tmp_path / "eval.jsonl")
    one = TrainingResource().command("/runs/x/.job-run.json", training)
    assert one == [sys.executable, "-m", "dragon_dagster.engine.runtime.worker", "/runs/x/.job-run.json"]
    resource = TrainingResource(workers=2, termination_timeout_s=300)
    two = resource.command("/j.json", training.model_copy(update={"parallel": resource.parallel()}))
    # torchrun stops its ranks before the resource kills the agent's group, which does not hold them
    assert two[1:6] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "--shutdown-timeout=290"]
    assert two[-3:] == ["-m", "dragon_dagster.engine.runtime.worker", "/j.json"]
    on_ray = TrainingResource(launcher="ray", workers=2)
    assert on_ray.command("s3://b/j.json", training.model_copy(update={"parallel": on_ray.parallel()})) == [
        "python",
        "-m",
        "dragon_dagster.engine.runtime.worker",
        "s3://b/j.json",
    ]  # the driver; Ray Train runs the ranks
