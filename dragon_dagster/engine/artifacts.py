"""Immutable artifact directories, written under a temporary name and renamed when complete.

A crash, a cancel or a failed check never leaves a half-written directory where a downstream stage would
read it: readers only ever see finished directories.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

MANIFEST = "manifest.json"


def new_artifact_path(root: Path, pipeline: str, stage: str, run_id: str | None = None) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    suffix = (run_id or uuid.uuid4().hex)[:8]
    return Path(root) / pipeline / stage / f"{stamp}-{suffix}"


@contextmanager
def staged_dir(final: Path) -> Iterator[Path]:
    """Yield a temporary sibling of `final`; rename it to `final` only if the block succeeds."""
    final = Path(final)
    if final.exists():
        raise FileExistsError(f"artifact directory already exists and is immutable: {final}")
    tmp = final.with_name(f".tmp-{final.name}-{uuid.uuid4().hex[:6]}")
    tmp.mkdir(parents=True)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    tmp.rename(final)


def write_json_atomic(path: Path, data: dict) -> None:
    """Write a small JSON file (a pointer, a status) so that readers see the old or the new one, never half."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{path.name}-{uuid.uuid4().hex[:6]}")
    with tmp.open("w") as f:
        json.dump(data, f, indent=2, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_manifest(directory: Path, **fields) -> None:
    fields.setdefault("created", time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    (Path(directory) / MANIFEST).write_text(json.dumps(fields, indent=2, default=str))


def read_manifest(directory: str | Path) -> dict:
    path = Path(directory) / MANIFEST
    return json.loads(path.read_text()) if path.exists() else {}


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())
