"""Artifacts on shared storage: an object store (s3://...) or a shared mount (file:///...), through fsspec.

An object store has no rename, so an artifact there is made complete-or-absent by a marker: every file of
the artifact is uploaded first, then `.complete`, a small JSON object listing each file and its size. A
prefix without the marker is absent to every reader (an upload cut off midway, a worker that died), and a
reader copies exactly the files the marker lists, checking their sizes. An artifact with its marker is never
overwritten (`publish_dir` refuses, as `staged_dir` does locally).

Jobs run on other nodes through the same store:
- the parent rewrites the job (`remote_job`): paths into local artifacts become URIs, the output directory a
  staging URI, and uploads what the job reads from its own output directory (`push_inputs`);
- the worker runs it inside `localized(job, cache_dir)`: inputs downloaded (each immutable artifact once per
  node), a local temporary output directory, uploaded to the staging URI with its marker on success only;
- the parent copies the finished output into the asset's local staging directory (`collect`) and removes the
  staging prefix (`discard` on failure too); ArtifactStore.new_artifact then publishes the artifact for good.

Credentials and endpoints come from the environment only (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_ENDPOINT_URL, AWS_MAX_ATTEMPTS, ... as s3fs and botocore read them), never from a job or a config file,
so no secret lands in YAML, a job file or an artifact. Framework-free: fsspec only (s3fs for s3://, the
`dragon-dagster[s3]` extra), imported when a URI is used.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..artifacts.directories import staged_dir
from ..config.job import Job, RemoteTarget, map_paths

MARKER = ".complete"
STAGING = ".staging"
ARTIFACT_DEPTH = 3  # <pipeline>/<stage>/<name>


class RemoteStoreError(RuntimeError):
    """Shared storage failed or holds no complete artifact at a URI; the message names the URI."""


def is_uri(value) -> bool:
    return isinstance(value, str) and "://" in value


def join(uri: str, *parts: str) -> str:
    return "/".join([uri.rstrip("/"), *(p.strip("/") for p in parts if p and p != ".")])


_FILESYSTEMS: dict[tuple, object] = {}


def filesystem(uri: str):
    """(fsspec filesystem, path within it) for a URI. Without listing caches: another node may have published
    since. One instance per protocol and environment (a new S3 client costs about half a second), so a
    changed endpoint or credential in the environment, and a forked process, get a client of their own."""
    import fsspec

    protocol = uri.split("://", 1)[0]
    if protocol in ("file", "local"):
        return fsspec.core.url_to_fs(uri, auto_mkdir=True)  # a shared mount: directories appear as files do
    key = (protocol, os.getpid(), tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_"))))
    try:
        if key not in _FILESYSTEMS:
            _FILESYSTEMS[key] = fsspec.filesystem(protocol, skip_instance_cache=True, use_listings_cache=False)
    except ImportError as exc:
        raise RemoteStoreError(f"cannot open {uri}: {exc} (pip install 'dragon-dagster[s3]' for s3://)") from exc
    fs = _FILESYSTEMS[key]
    return fs, fs._strip_protocol(uri)


def _failure(action: str, uri: str, exc: BaseException) -> RemoteStoreError:
    return RemoteStoreError(f"could not {action} {uri}: {type(exc).__name__}: {exc}")


# ------------------------------------------------------------------------------------------ one directory


def _local_files(local: Path) -> dict[str, int]:
    """{relative posix path: size} of every regular file under local, in a stable order; the marker never."""
    files = {}
    for dirpath, _dirs, names in os.walk(local):
        for name in names:
            path = Path(dirpath) / name
            if path.is_file() and not path.is_symlink():
                rel = path.relative_to(local).as_posix()
                if rel != MARKER:
                    files[rel] = path.stat().st_size
    return dict(sorted(files.items()))


def _upload(fs, local_file: Path, remote_path: str) -> None:
    """One file, one object (a separate function so a test can cut an upload off midway)."""
    fs.put_file(str(local_file), remote_path)


def read_marker(uri: str, fs=None) -> dict | None:
    """The marker of the artifact at uri, or None when there is none (absent or incomplete)."""
    fs, path = (fs, fs._strip_protocol(uri)) if fs is not None else filesystem(uri)
    try:
        return json.loads(fs.cat_file(join(path, MARKER)))
    except FileNotFoundError:
        return None
    except Exception as exc:
        raise _failure("read", join(uri, MARKER), exc) from exc


def is_complete(uri: str) -> bool:
    return read_marker(uri) is not None


def publish_dir(local: Path, uri: str, replace_incomplete: bool = True) -> dict:
    """Upload the directory local to uri: every file, then the marker. Returns the marker.

    Refuses (FileExistsError) when a complete artifact is there already. What an earlier, interrupted upload
    left there (no marker) is removed first with replace_incomplete. A failure removes what this call wrote
    where it can and raises RemoteStoreError naming uri; without the marker nothing of it counts anyway."""
    fs, path = filesystem(uri)
    if read_marker(uri, fs) is not None:
        raise FileExistsError(f"artifact already exists and is immutable: {uri}")
    files = _local_files(Path(local))
    try:
        if replace_incomplete and fs.exists(path):
            fs.rm(path, recursive=True)
        for rel in files:
            _upload(fs, Path(local) / rel, join(path, rel))
        marker = {"files": files, "published": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        fs.pipe_file(join(path, MARKER), json.dumps(marker, indent=1).encode())  # last: now it exists
    except BaseException as exc:
        _remove_quietly(fs, path)
        if isinstance(exc, Exception):
            raise _failure("upload to", uri, exc) from exc
        raise
    return marker


def _remove_quietly(fs, path: str) -> None:
    try:
        if fs.exists(path):
            fs.rm(path, recursive=True)
    except Exception:  # unreachable store: the leftovers have no marker, so they read as absent
        pass


def remove(uri: str) -> None:
    """Delete everything under uri (a staging prefix); nothing there is no error."""
    fs, path = filesystem(uri)
    try:
        if fs.exists(path):
            fs.rm(path, recursive=True)
    except Exception as exc:
        raise _failure("remove", uri, exc) from exc


def _download_files(fs, uri: str, path: str, files: dict[str, int], into: Path) -> None:
    for rel, size in files.items():
        target = into / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():  # a read-only file copied in earlier (collect into a staging dir)
            target.chmod(0o644)
        fs.get_file(join(path, rel), str(target))
        if target.stat().st_size != size:
            raise RemoteStoreError(f"{join(uri, rel)} has {target.stat().st_size} bytes, its marker says {size}")


def fetch_dir(uri: str, local: Path) -> Path:
    """The complete artifact at uri, copied to the local directory local (staged, renamed, read-only, as
    staged_dir writes artifacts); an existing local copy is returned as it is. RemoteStoreError naming uri
    when there is no complete artifact there or the store cannot be read."""
    local = Path(local)
    if local.exists():
        return local
    fs, path = filesystem(uri)
    marker = read_marker(uri, fs)
    if marker is None:
        raise RemoteStoreError(
            f"no complete artifact at {uri} (absent, or its upload never finished: no {MARKER} marker)"
        )
    try:
        with staged_dir(local) as tmp:
            _download_files(fs, uri, path, marker["files"], tmp)
    except FileExistsError:  # another process fetched it meanwhile: the same immutable artifact
        return local
    except RemoteStoreError:
        raise
    except Exception as exc:
        if isinstance(exc, OSError) and local.exists():  # lost the rename race (ENOTEMPTY): the same artifact
            return local
        raise _failure("download", uri, exc) from exc
    return local


# ------------------------------------------------------------------------------------- jobs on other nodes


def _to_uri(value, output_dir: Path | None, artifacts: Path, artifact_uri: str, output_uri: str):
    """value as the worker will see it: a URI for a path into the output or an artifact, else unchanged."""
    if not isinstance(value, str) or not value or is_uri(value) or not Path(value).is_absolute():
        return value
    path = Path(value).resolve()
    for root, uri in ((output_dir, output_uri), (artifacts, artifact_uri)):  # the output is under artifacts
        if root is not None and (path == root or root in path.parents):
            return join(uri, path.relative_to(root).as_posix())
    return value  # a base model, the checkpoints: the worker must reach them as they are (a shared mount)


def remote_job(job: Job, local_root: Path, artifact_uri: str, output_uri: str) -> Job:
    """The job for a worker on another node: paths under local_root/artifacts as URIs under artifact_uri,
    paths into the job's own output directory as URIs under output_uri (push_inputs uploads them), and
    output_dir = output_uri. Other paths stay as they are: checkpoint_dir and a base model directory must be
    reachable on the worker as they are (a shared mount); a hub id is no path. Every JobPath field is found by
    walking the job's model (config/job.py)."""
    artifacts = (Path(local_root) / "artifacts").resolve()
    output_dir = Path(job.output_dir).resolve()
    base = artifact_uri.rstrip("/")
    out = map_paths(job, lambda v: _to_uri(v, output_dir, artifacts, base, output_uri))
    return out.model_copy(
        update={"output_dir": output_uri, "remote": RemoteTarget(artifact_uri=base, output_uri=output_uri)}
    )


def staging_uri(artifact_uri: str, run_id: str, relative: str) -> str:
    """Where a remote worker writes an artifact's output before the parent collects it:
    <artifact_uri>/.staging/<run_id>/<pipeline>/<stage>/<name>-<nonce>."""
    return join(artifact_uri, STAGING, run_id, f"{relative.strip('/')}-{os.urandom(3).hex()}")


LOCAL_ONLY = (".job-run.json", "status.json")  # the launcher's run file (absolute local paths), the outcome


def push_inputs(workdir: Path, output_uri: str, exclude: tuple[str, ...] = LOCAL_ONLY) -> None:
    """Upload what the parent already put in the artifact's staging dir (job.json, data/, rewards/): the job
    reads some of it, and the worker's output dir starts as a copy of it. No marker: it is not an output.
    exclude: top-level files that only mean something on this machine."""
    fs, path = filesystem(output_uri)
    try:
        for rel in (r for r in _local_files(Path(workdir)) if r not in exclude):
            _upload(fs, Path(workdir) / rel, join(path, rel))
    except Exception as exc:
        raise _failure("upload the inputs to", output_uri, exc) from exc


def _cache_path(cache_dir: Path, uri: str) -> Path:
    """A node-local directory for the artifact at uri: readable, and one per URI."""
    digest = hashlib.sha256(uri.encode()).hexdigest()[:16]
    return Path(cache_dir) / "artifacts" / f"{uri.rstrip('/').rsplit('/', 1)[-1]}-{digest}"


def fetch_input(uri: str, artifact_uri: str, cache_dir: Path) -> str:
    """A local path for uri, a complete artifact under artifact_uri or a file or folder inside one; the
    artifact is downloaded into cache_dir once (it is immutable) and reused afterwards."""
    base = artifact_uri.rstrip("/")
    if not uri.startswith(base + "/"):
        raise RemoteStoreError(f"{uri} is not under the artifact store {base}")
    parts = uri[len(base) + 1 :].strip("/").split("/")
    if len(parts) < ARTIFACT_DEPTH or ".." in parts:
        raise RemoteStoreError(f"{uri} names no artifact under {base} (<pipeline>/<stage>/<name>/...)")
    artifact = join(base, *parts[:ARTIFACT_DEPTH])
    local = fetch_dir(artifact, _cache_path(cache_dir, artifact))
    return str(local.joinpath(*parts[ARTIFACT_DEPTH:]))


def _fetch_prefix(uri: str, local: Path) -> None:
    """Everything under uri (no marker needed: the parent's push_inputs) into local; nothing there is fine."""
    fs, path = filesystem(uri)
    try:
        if not fs.exists(path):
            return
        for remote in fs.find(path):
            rel = remote[len(path.rstrip("/")) + 1 :]
            if rel and rel != MARKER:
                (local / rel).parent.mkdir(parents=True, exist_ok=True)
                fs.get_file(remote, str(local / rel))
    except Exception as exc:
        raise _failure("download the inputs from", uri, exc) from exc


@contextmanager
def localized(job: Job, cache_dir: Path, publish: bool = True) -> Iterator[Job]:
    """The worker's side of remote_job: yields the job with local paths (its `remote` taken out) and a local
    temporary output_dir; when the block succeeds, the output dir goes to the output URI, files then marker.
    A failed block uploads nothing, and neither does one with publish False (a data-parallel rank other than
    0: it reads the inputs too, rank 0 alone writes). A job without `remote` is yielded unchanged."""
    if job.remote is None:
        yield job
        return
    artifact_uri, output_uri = job.remote.artifact_uri, job.remote.output_uri
    Path(cache_dir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="output-", dir=cache_dir) as tmp:
        out = Path(tmp)
        _fetch_prefix(output_uri, out)

        def local(value):
            if not is_uri(value):
                return value
            if value.rstrip("/") == output_uri.rstrip("/"):
                return str(out)
            if value.startswith(output_uri.rstrip("/") + "/"):
                return str(out / value[len(output_uri.rstrip("/")) + 1 :])
            return fetch_input(value, artifact_uri, cache_dir)

        yield map_paths(job, local).model_copy(update={"remote": None})
        if publish:
            publish_dir(out, output_uri)


def collect(output_uri: str, local_dir: Path) -> dict:
    """Copy a remote worker's finished output (the files its marker lists) into local_dir, the asset's
    staging dir, then delete the staging prefix. Returns the marker. RemoteStoreError naming output_uri when
    the worker left no complete output there."""
    fs, path = filesystem(output_uri)
    marker = read_marker(output_uri, fs)
    if marker is None:
        raise RemoteStoreError(f"no complete output at {output_uri}: the worker did not finish uploading it")
    try:
        _download_files(fs, output_uri, path, marker["files"], Path(local_dir))
    except RemoteStoreError:
        raise
    except Exception as exc:
        raise _failure("download", output_uri, exc) from exc
    remove(output_uri)
    return marker


def discard(output_uri: str) -> None:
    """Remove a staging prefix after a failed or cancelled remote job; never raises (cleanup on a failure
    path: the prefix has no marker, and a bucket lifecycle rule on .staging/ removes what stays)."""
    try:
        remove(output_uri)
    except Exception:
        pass
