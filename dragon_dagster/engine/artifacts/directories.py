"""Immutable artifact directories, written under a temporary name and renamed when complete.

A crash, a cancel or a failed check never leaves a half-written directory where a downstream stage would
read it: readers only ever see finished directories. A finished directory is on disk before its name is
(files and directories fsynced, then the rename, then the parent fsynced) and is read-only afterwards (no
write bits on its files and directories: `remove_tree` deletes one). The staging name carries the run that
writes it (`.tmp-<name>.run-<run id>.<random>`), so a cleaner can tell a live run's staging directory from
one a killed run left behind (ArtifactStore.clean_stale_staging).

On shared storage (ArtifactStore.artifact_uri: an object store has no rename) the same promise is kept by a
marker object written after every file: runtime/remote.py.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

STAGING_PREFIX = ".tmp-"
_OWNER = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_STAGING = re.compile(r"^\.tmp-(?P<name>.+)\.run-(?P<owner>[A-Za-z0-9_-]{1,64})\.(?P<nonce>[0-9a-f]{6})$")


def new_artifact_path(root: Path, pipeline: str, stage: str, run_id: str | None = None) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    suffix = (run_id or uuid.uuid4().hex)[:8]
    return Path(root) / pipeline / stage / f"{stamp}-{suffix}"


def staging_name(final_name: str, owner: str | None = None) -> str:
    """The temporary sibling's name for `final_name`; with the owning run's id when it is a plain id."""
    nonce = uuid.uuid4().hex[:6]
    if owner and _OWNER.match(owner):
        return f"{STAGING_PREFIX}{final_name}.run-{owner}.{nonce}"
    return f"{STAGING_PREFIX}{final_name}-{nonce}"


def staging_owner(name: str) -> str | None:
    """The run id a staging directory's name carries; None for other names (older staging names included)."""
    match = _STAGING.match(name)
    return match.group("owner") if match else None


@contextmanager
def staged_dir(final: Path, owner: str | None = None) -> Iterator[Path]:
    """Yield a temporary sibling of `final`; when the block succeeds, make it durable, rename it to `final`
    and make it read-only. owner: the run writing it (a Dagster run id), carried in the temporary name."""
    final = Path(final)
    if final.exists():
        raise FileExistsError(f"artifact directory already exists and is immutable: {final}")
    tmp = final.with_name(staging_name(final.name, owner))
    tmp.mkdir(parents=True)
    try:
        yield tmp
        fsync_tree(tmp)
        if final.exists():  # os.rename would replace an empty directory: never overwrite an artifact
            raise FileExistsError(f"artifact directory already exists and is immutable: {final}")
        os.rename(tmp, final)
    except BaseException:
        remove_tree(tmp)
        raise
    fsync_dir(final.parent)
    make_read_only(final)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path: Path) -> None:
    """fsync every regular file under path, then every directory (deepest first), path included."""
    for dirpath, _dirs, files in os.walk(path, topdown=False):
        for name in files:
            file = os.path.join(dirpath, name)
            if os.path.islink(file) or not os.path.isfile(file):
                continue
            fd = os.open(file, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(dirpath))


def make_read_only(path: Path) -> None:
    """Remove the write bits of every file and directory under path, path included (symlinks aside)."""
    for dirpath, _dirs, files in os.walk(path, topdown=False):
        for entry in [*(os.path.join(dirpath, f) for f in files), dirpath]:
            if not os.path.islink(entry):
                os.chmod(entry, stat.S_IMODE(os.lstat(entry).st_mode) & ~0o222)


def is_read_only(path: Path) -> bool:
    """No write bit on path or on anything under it (symlinks aside)."""
    for dirpath, _dirs, files in os.walk(path):
        for entry in [dirpath, *(os.path.join(dirpath, f) for f in files)]:
            if not os.path.islink(entry) and os.lstat(entry).st_mode & 0o222:
                return False
    return True


def remove_tree(path: Path) -> None:
    """Delete a directory tree, read-only artifacts included (a directory without its write bit keeps its
    entries from an unprivileged rmtree); a missing path is no error."""
    path = Path(path)
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
        return
    if not path.exists():
        return
    for dirpath, _dirs, _files in os.walk(path):
        try:
            os.chmod(dirpath, stat.S_IMODE(os.lstat(dirpath).st_mode) | stat.S_IRWXU)
        except FileNotFoundError:
            pass
    shutil.rmtree(path, ignore_errors=True)
    if path.exists():  # something changed underneath: one more pass, and report what stays
        shutil.rmtree(path)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())
