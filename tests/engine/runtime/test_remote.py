"""Artifacts on shared storage (ArtifactStore.artifact_uri, engine/remote.py) against a real S3-compatible server.

The server is moto's (conftest's `moto_endpoint`, on 127.0.0.1 on a free port). Every test gets a bucket of its
own (conftest's `bucket`); credentials and the endpoint reach s3fs through the environment only, as in production.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from dragon_dagster.engine import catalog
from dragon_dagster.engine.artifacts.directories import is_read_only, remove_tree
from dragon_dagster.engine.config.job import Job, TrainingInputs
from dragon_dagster.engine.runtime import remote
from dragon_dagster.engine.runtime.remote import MARKER, RemoteStoreError
from dragon_dagster.engine.stages.sft.settings import SFT
from dragon_dagster.resources import ArtifactStore
from tests.support import bucket_keys, closed_port, write_pipeline


def write_artifact(store: ArtifactStore, stage: str = "sft_dataset", run_id: str = "run1") -> Path:
    with store.new_artifact("tiny", stage, run_id) as (tmp, final):
        (tmp / "train.jsonl").write_text('{"x": 1}\n{"x": 2}\n')
        (tmp / "sub").mkdir()
        (tmp / "sub" / "weights.bin").write_bytes(os.urandom(2048))
        (tmp / "manifest.json").write_text(json.dumps({"kind": "dataset"}))
    return final


# ------------------------------------------------------------------------------------------------ publish


def test_publish_uploads_every_file_before_the_marker(bucket, tmp_path, monkeypatch):
    store = ArtifactStore(runs_dir=str(tmp_path / "runs"), artifact_uri=f"s3://{bucket}/team")
    seen = []
    upload = remote._upload

    def watched(fs, local_file, remote_path):
        seen.append((remote_path, bucket_keys(bucket)))  # what the bucket held before each file went up
        upload(fs, local_file, remote_path)

    monkeypatch.setattr(remote, "_upload", watched)

    final = write_artifact(store)
    uri = store.uri_for(final)
    rel = final.relative_to(store.root / "artifacts").as_posix()
    assert uri == f"s3://{bucket}/team/{rel}"
    assert len(seen) == 3 and not any(k.endswith(MARKER) for _, before in seen for k in before)
    assert bucket_keys(bucket) == sorted(
        f"team/{rel}/{name}" for name in ("train.jsonl", "sub/weights.bin", "manifest.json", MARKER)
    )
    marker = remote.read_marker(uri)
    assert marker["files"] == {
        "manifest.json": final.joinpath("manifest.json").stat().st_size,
        "sub/weights.bin": 2048,
        "train.jsonl": 18,
    }
    assert is_read_only(final)  # the local copy is still an ordinary finished artifact
    assert store.uri_for(tmp_path / "elsewhere") is None
    assert ArtifactStore(runs_dir=str(tmp_path / "runs")).uri_for(final) is None  # no artifact_uri: local only


def test_an_upload_cut_off_midway_leaves_no_artifact_anywhere(bucket, tmp_path, monkeypatch):
    store = ArtifactStore(runs_dir=str(tmp_path / "runs"), artifact_uri=f"s3://{bucket}/team")
    calls = []
    upload = remote._upload

    def flaky(fs, local_file, remote_path):
        calls.append(remote_path)
        if len(calls) == 2:
            raise ConnectionResetError("connection reset by peer")
        upload(fs, local_file, remote_path)

    monkeypatch.setattr(remote, "_upload", flaky)

    with pytest.raises(RemoteStoreError, match=f"s3://{bucket}/team/tiny/sft_dataset/.*ConnectionResetError"):
        write_artifact(store)
    uri = calls[0].rsplit("/", 1)[0]
    assert not remote.is_complete(f"s3://{uri}")
    assert not [k for k in bucket_keys(bucket) if k.endswith(MARKER)]
    assert not list((store.root / "artifacts" / "tiny" / "sft_dataset").iterdir())  # no local one, no staging
    with pytest.raises(RemoteStoreError, match="no complete artifact at s3://"):
        store.local(f"s3://{uri}")


def test_an_incomplete_prefix_reads_as_absent(bucket, tmp_path):
    import boto3

    boto3.client("s3").put_object(Bucket=bucket, Key="team/tiny/sft_dataset/x-1/train.jsonl", Body=b"half")
    store = ArtifactStore(runs_dir=str(tmp_path / "runs"), artifact_uri=f"s3://{bucket}/team")
    with pytest.raises(RemoteStoreError, match=f"s3://{bucket}/team/tiny/sft_dataset/x-1 .*no {MARKER}"):
        store.local(f"s3://{bucket}/team/tiny/sft_dataset/x-1/train.jsonl")
    assert not (store.root / "artifacts" / "tiny" / "sft_dataset" / "x-1").exists()


def test_a_complete_remote_artifact_is_never_overwritten(bucket, tmp_path, monkeypatch):
    from dragon_dagster.resources import storage

    store = ArtifactStore(runs_dir=str(tmp_path / "runs"), artifact_uri=f"s3://{bucket}/team")
    final = write_artifact(store)
    with pytest.raises(FileExistsError, match="immutable"):
        remote.publish_dir(final, store.uri_for(final))
    # another machine choosing the same name: its local cache is empty, the remote artifact is not
    other = ArtifactStore(runs_dir=str(tmp_path / "other"), artifact_uri=store.artifact_uri)
    same = other.root / "artifacts" / final.relative_to(store.root / "artifacts")
    monkeypatch.setattr(storage, "new_artifact_path", lambda *args: same)
    before = remote.read_marker(store.uri_for(final))
    with pytest.raises(FileExistsError, match=f"s3://{bucket}/team/tiny/sft_dataset"):
        write_artifact(other)
    assert not same.exists() and remote.read_marker(store.uri_for(final)) == before


# ------------------------------------------------------------------------------------------ local copies


def test_local_fetches_the_artifact_into_a_fresh_runs_dir(bucket, tmp_path, monkeypatch):
    store = ArtifactStore(runs_dir=str(tmp_path / "runs"), artifact_uri=f"s3://{bucket}/team")
    final = write_artifact(store)
    weights = (final / "sub" / "weights.bin").read_bytes()
    assert store.local(final) == final  # present: no request at all
    assert store.local(str(final / "train.jsonl")) == final / "train.jsonl"

    node = ArtifactStore(runs_dir=str(tmp_path / "node2"), artifact_uri=store.artifact_uri)
    got = node.local(store.uri_for(final) + "/sub/weights.bin")  # a file inside an artifact, by URI
    mirror = node.root / "artifacts" / final.relative_to(store.root / "artifacts")
    assert got == mirror / "sub" / "weights.bin" and got.read_bytes() == weights
    assert is_read_only(mirror) and not (mirror / MARKER).exists()
    assert not list(mirror.parent.glob(".tmp-*"))

    remove_tree(final)  # a cleaned cache: the path the asset recorded comes back from the store
    assert store.local(final) == final and (final / "train.jsonl").read_text() == '{"x": 1}\n{"x": 2}\n'

    with pytest.raises(RemoteStoreError, match=f"no complete artifact at s3://{bucket}/team/tiny/sft_dataset/nope"):
        node.local(f"s3://{bucket}/team/tiny/sft_dataset/nope")
    with pytest.raises(FileNotFoundError, match="no artifact_uri"):
        ArtifactStore(runs_dir=str(tmp_path / "plain")).local(tmp_path / "plain" / "artifacts" / "a" / "b" / "c")


# ------------------------------------------------------------------------------------- errors name the URI


def test_a_missing_bucket_fails_the_asset_naming_the_uri(bucket, tmp_path):
    store = ArtifactStore(runs_dir=str(tmp_path / "runs"), artifact_uri=f"s3://{bucket}-missing/team")
    with pytest.raises(RemoteStoreError, match=f"s3://{bucket}-missing/team/tiny/sft_dataset/.*bucket does not"):
        write_artifact(store)
    assert not list((store.root / "artifacts" / "tiny" / "sft_dataset").iterdir())


def test_an_unreachable_endpoint_fails_fast_naming_the_uri(bucket, tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{closed_port()}")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # botocore's retries, read from the environment like the rest
    store = ArtifactStore(runs_dir=str(tmp_path / "runs"), artifact_uri=f"s3://{bucket}/team")
    start = time.monotonic()
    with pytest.raises(RemoteStoreError, match=f"s3://{bucket}/team/tiny/sft_dataset/x-1.*EndpointConnection"):
        store.local(f"s3://{bucket}/team/tiny/sft_dataset/x-1")
    with pytest.raises(RemoteStoreError, match=f"s3://{bucket}/team/tiny/sft_dataset/"):
        write_artifact(store)
    assert time.monotonic() - start < 30


# ------------------------------------------------------------------------------------- jobs on other nodes


def sft_job(output_dir: str, **inputs) -> Job:
    """A typed training job (the sft kind's), with the given training inputs."""
    return catalog.get("sft").job_model()(
        settings=SFT(name="sft_adapter", kind="sft", dataset="sft_dataset"),
        inputs=TrainingInputs(**inputs),
        output_dir=output_dir,
    )


def fake_worker(job: Job) -> None:
    """A stand-in for a trainer: reads its inputs, writes its outputs into output_dir."""
    out = Path(job.output_dir)
    rows = Path(job.inputs.train_file).read_text().splitlines()
    assert Path(job.inputs.eval_file).read_text() == "held out\n"  # written by the parent into the staging dir
    assert (Path(job.inputs.adapters[0]) / "adapter_model.safetensors").read_bytes() == b"weights"
    (out / "adapter").mkdir()
    (out / "adapter" / "adapter_model.safetensors").write_bytes(b"trained on %d rows" % len(rows))
    (out / "metrics.json").write_text(json.dumps({"rows": len(rows)}))


def test_a_job_runs_on_another_node_through_the_store(bucket, tmp_path, monkeypatch):
    store = ArtifactStore(runs_dir=str(tmp_path / "runs"), artifact_uri=f"s3://{bucket}/team")
    dataset = write_artifact(store)
    with store.new_artifact("tiny", "sft_adapter", "run0") as (tmp, upstream):
        (tmp / "adapter").mkdir()
        (tmp / "adapter" / "adapter_model.safetensors").write_bytes(b"weights")
    base_model = tmp_path / "models" / "base"

    with store.new_artifact("tiny", "dpo_adapter", "run2") as (tmp, final):
        (tmp / "data").mkdir()
        (tmp / "data" / "eval.jsonl").write_text("held out\n")
        (tmp / ".job-run.json").write_text("{}")  # the launcher's local run file: never shipped
        job = sft_job(
            str(tmp),
            model=str(base_model),
            adapters=[str(upstream / "adapter")],
            train_file=str(dataset / "train.jsonl"),
            eval_file=str(tmp / "data" / "eval.jsonl"),
            checkpoint_dir=str(store.root / "checkpoints" / "x"),
            resume_from=None,
        )
        output_uri = store.staging_uri(final, "run2")
        shipped = remote.remote_job(job, store.root, store.artifact_uri, output_uri)
        assert shipped.output_dir == output_uri and output_uri.startswith(f"s3://{bucket}/team/.staging/run2/")
        assert shipped.inputs.train_file == store.uri_for(dataset / "train.jsonl")
        assert shipped.inputs.adapters == [store.uri_for(upstream / "adapter")]
        assert shipped.inputs.eval_file == output_uri + "/data/eval.jsonl"
        assert (shipped.inputs.model, shipped.inputs.checkpoint_dir, shipped.inputs.resume_from) == (
            job.inputs.model,
            job.inputs.checkpoint_dir,
            None,
        )  # outside the artifacts: must be reachable as they are
        remote.push_inputs(tmp, output_uri)

        # the worker's node: only the job (as JSON) and the environment
        cache = tmp_path / "node" / "cache"
        received = type(shipped).model_validate(json.loads(shipped.model_dump_json()))
        with remote.localized(received, cache) as local_job:
            assert local_job.remote is None and not remote.is_uri(local_job.inputs.train_file)
            assert local_job.inputs.model == str(base_model)
            fake_worker(local_job)
        assert remote.is_complete(output_uri)

        remote.collect(output_uri, tmp)
        assert (tmp / ".job-run.json").read_text() == "{}"  # the worker never had it
        (tmp / ".job-run.json").unlink()  # as the launcher does after the run
        assert not bucket_keys(bucket, output_uri.split(f"{bucket}/", 1)[1])  # staging prefix gone
    assert (final / "adapter" / "adapter_model.safetensors").read_bytes() == b"trained on 2 rows"
    assert (final / "data" / "eval.jsonl").read_text() == "held out\n"
    published = remote.read_marker(store.uri_for(final))["files"]
    assert set(published) == {"adapter/adapter_model.safetensors", "data/eval.jsonl", "metrics.json"}

    # a second job on the same node reads the same immutable inputs from its cache
    fetched = []
    download = remote._download_files
    monkeypatch.setattr(remote, "_download_files", lambda *a: (fetched.append(a[1]), download(*a)))
    again = remote.remote_job(
        job.model_copy(update={"output_dir": str(tmp_path / "runs" / "artifacts" / "tiny" / "x" / "y")}),
        store.root,
        store.artifact_uri,
        store.staging_uri(final, "run3"),
    )
    again = again.model_copy(
        update={"inputs": again.inputs.model_copy(update={"eval_file": store.uri_for(dataset / "train.jsonl")})}
    )
    with remote.localized(again, cache) as local_job:
        assert Path(local_job.inputs.train_file).read_text().count("\n") == 2
    assert fetched == []
    remote.discard(again.output_dir)


def test_remote_job_rewrites_every_path_into_the_artifacts_and_nothing_else(tmp_path):
    from dragon_dagster.engine.stages.evaluate.inputs import ChainStage, ReportInputs
    from dragon_dagster.engine.stages.evaluate.settings import Evaluate
    from dragon_dagster.engine.stages.evaluate.worker import ReportJob

    arts = tmp_path / "runs" / "artifacts"
    adapter = str(arts / "tiny" / "sft_adapter" / "a-1" / "adapter")
    job = ReportJob(
        settings=Evaluate(name="evaluation_report", kind="evaluate", dataset="sft_dataset"),
        inputs=ReportInputs(
            base_model="org/hub-model",
            merged_model=str(arts / "tiny" / "merged_model" / "m-1" / "model"),
            eval_file=str(tmp_path / "data" / "eval.jsonl"),
            first_stage_adapters=[adapter],
            chain=[ChainStage(name="sft_adapter", dir=adapter[: -len("/adapter")], objective="sft", loss_label="loss")],
            max_len=64,
        ),
        output_dir=str(arts / "tiny" / "evaluation_report" / ".tmp-r-1"),
    )
    got = remote.remote_job(job, tmp_path / "runs", "s3://b/p/", "s3://b/p/.staging/r/x")
    assert got.inputs.merged_model == "s3://b/p/tiny/merged_model/m-1/model"
    assert got.inputs.first_stage_adapters == ["s3://b/p/tiny/sft_adapter/a-1/adapter"]
    assert [(s.name, s.dir) for s in got.inputs.chain] == [("sft_adapter", "s3://b/p/tiny/sft_adapter/a-1")]
    assert (got.inputs.base_model, got.inputs.eval_file, got.inputs.max_len) == (
        "org/hub-model",
        str(tmp_path / "data" / "eval.jsonl"),
        64,
    )
    assert got.remote.model_dump() == {"artifact_uri": "s3://b/p", "output_uri": "s3://b/p/.staging/r/x"}
    assert job.output_dir.endswith(".tmp-r-1") and job.remote is None  # the caller's job is left as it was
    assert job.inputs.chain[0].dir == adapter[: -len("/adapter")]


def test_a_failed_job_uploads_nothing(bucket, tmp_path):
    store = ArtifactStore(runs_dir=str(tmp_path / "runs"), artifact_uri=f"s3://{bucket}/team")
    dataset = write_artifact(store)
    output_uri = f"s3://{bucket}/team/.staging/run9/tiny/sft_adapter/x-1-abc"
    job = remote.remote_job(
        sft_job(
            str(tmp_path / "w"),
            model="org/hub-model",
            train_file=str(dataset / "train.jsonl"),
            checkpoint_dir=str(tmp_path / "ckpt"),
        ),
        store.root,
        store.artifact_uri,
        output_uri,
    )
    with pytest.raises(ValueError, match="diverged"):
        with remote.localized(job, tmp_path / "cache") as local_job:
            (Path(local_job.output_dir) / "half.bin").write_bytes(b"x")
            raise ValueError("loss diverged")
    assert not remote.is_complete(output_uri) and not bucket_keys(bucket, "team/.staging/")
    with pytest.raises(RemoteStoreError, match=f"no complete output at {output_uri}"):
        remote.collect(output_uri, tmp_path / "w")
    assert not list((tmp_path / "cache").glob("output-*"))  # the temporary output dir is gone too


# ------------------------------------------------------------------------------------------ shared mount


def test_a_shared_mount_by_file_uri(tmp_path):
    mount = tmp_path / "mnt" / "shared"
    store = ArtifactStore(runs_dir=str(tmp_path / "runs"), artifact_uri=mount.as_uri())
    final = write_artifact(store)
    rel = final.relative_to(store.root / "artifacts")
    assert store.uri_for(final) == f"{mount.as_uri()}/{rel.as_posix()}"
    assert (mount / rel / MARKER).is_file() and (mount / rel / "sub" / "weights.bin").stat().st_size == 2048
    node = ArtifactStore(runs_dir=str(tmp_path / "node2"), artifact_uri=mount.as_uri())
    assert node.local(store.uri_for(final)).joinpath("train.jsonl").read_text() == '{"x": 1}\n{"x": 2}\n'
    (mount / rel / MARKER).unlink()  # as if the publish had stopped before its marker
    with pytest.raises(RemoteStoreError, match=f"no complete artifact at {mount.as_uri()}"):
        ArtifactStore(runs_dir=str(tmp_path / "node3"), artifact_uri=mount.as_uri()).local(store.uri_for(final))


# ------------------------------------------------------------------------------------- a real pipeline stage


@pytest.mark.slow
def test_a_pipeline_trains_and_merges_through_the_bucket(bucket, tiny_model, tmp_path, monkeypatch):
    """Every artifact is published; the training and merge jobs go through the store (the worker fetches what
    it reads into its node's cache and uploads what it writes); a step whose machine lost its local copies
    fetches them back."""
    from dagster import AssetSelection, DagsterInstance, materialize

    from dragon_dagster.assets.factory import build_pipeline_defs
    from dragon_dagster.engine.pipeline import load
    from dragon_dagster.resources import MLflowTracking, TrainingResource

    cache = tmp_path / "node-cache"
    monkeypatch.setenv("DRAGON_ARTIFACT_CACHE", str(cache))
    pipeline = load(write_pipeline(tmp_path / "defs", tiny_model))
    runs = tmp_path / "runs"
    store = ArtifactStore(runs_dir=str(runs), artifact_uri=f"s3://{bucket}/shared")
    resources = {
        "store": store,
        "tracking": MLflowTracking(runs_dir=str(runs)),
        "training": TrainingResource(device="cpu"),
    }
    parts, instance = build_pipeline_defs(pipeline), DagsterInstance.ephemeral()
    names = ("tickets", "sft_dataset", "sft_adapter", "merged_model")
    result = materialize(
        parts["assets"],
        instance=instance,
        resources=resources,
        selection=AssetSelection.assets(*[["tiny", n] for n in names]),
    )
    assert result.success
    published = bucket_keys(bucket, "shared/")
    for name in names:
        local = Path(result.output_for_node(f"tiny__{name}"))
        rel = local.relative_to(runs / "artifacts").as_posix()
        assert f"shared/{rel}/{MARKER}" in published, (name, published)
        assert set(remote.read_marker(store.uri_for(local))["files"]) == {
            p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file()
        }
    assert not [k for k in published if "/.staging/" in k], "each job's staging prefix is collected and removed"
    adapter = Path(result.output_for_node("tiny__sft_adapter"))
    fetched = list((cache / "artifacts").glob(f"{adapter.name}-*"))
    assert fetched and (fetched[0] / "adapter" / "adapter_model.safetensors").exists(), (
        "the merge worker read the adapter from the bucket, not from the runs directory"
    )
    assert (adapter / "adapter" / "adapter_model.safetensors").exists()  # collected back: the step's own copy
    assert not list(adapter.glob(".job-run.json")) and not list(adapter.glob("status.json"))

    remove_tree(adapter)  # this machine lost its copy (another node ran the training)
    again = materialize(
        parts["assets"],
        instance=instance,
        resources=resources,
        selection=AssetSelection.assets(["tiny", "merged_model"]),
    )
    assert again.success and (adapter / "adapter" / "adapter_model.safetensors").exists()
