"""Archiving artifacts: out of the way, every file kept, and back exactly as they were.

An archived artifact directory moves from runs_dir/artifacts/<pipeline>/<stage>/<id> to
runs_dir/archived/<pipeline>/<stage>/<id>. It is then gone from `dragon runs`, from what chat falls back to and from
what a run can reuse (a reuse needs the directory where it was made); restoring moves it back to the same path, so
the Dagster materializations and MLflow runs that name it find it again. Archiving is refused while the run that
made it is still going, and for an artifact another one continues from or reads (an adapter a later stage's chain
folds in, a dataset a stage trained on): archive that one first. Nothing is copied and nothing is deleted.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

from .artifacts.manifest import ManifestError, read_manifest
from .runs import artifact_dir_of, list_artifacts, paths_in

ARCHIVED = "archived"


class ArchiveError(ValueError):
    """An artifact that cannot be archived or restored; the message says why and what to do."""


def archived_root(runs_dir: Path) -> Path:
    return Path(runs_dir) / ARCHIVED


def _artifact(runs_dir: Path, target: str | Path) -> Path:
    """The artifact directory `target` names: a path in it, or `<pipeline>/<stage>/<id>`."""
    path = Path(target)
    if not path.is_absolute() and not path.exists():
        path = Path(runs_dir) / "artifacts" / path
    found = artifact_dir_of(path, runs_dir)
    if found is None or not found.is_dir():
        where = Path(runs_dir) / "artifacts"
        raise ArchiveError(f"{target} is not an artifact under {where} (`dragon runs` lists them)")
    return found


def referrers(runs_dir: Path, directory: Path) -> list[Path]:
    """The other artifacts whose manifests name a path in `directory` (they continue from it or read it). A path
    counts by its place under artifacts/ (`artifacts/<pipeline>/<stage>/<id>`), so a runs directory that was
    moved or copied keeps its references."""
    directory = Path(directory).resolve()
    place = "/" + "/".join(("artifacts", *directory.parts[-3:]))
    out = []
    for row in list_artifacts(runs_dir):
        other = Path(row["dir"]).resolve()
        if other == directory:
            continue
        try:
            fields = read_manifest(other).model_dump()
        except ManifestError:
            continue
        if any(place + "/" in value + "/" for value in paths_in(fields)):
            out.append(other)
    return sorted(out)


def _move(source: Path, target: Path) -> None:
    """Rename a (read-only) artifact directory: moving a directory to another parent rewrites its `..`, which needs
    write permission on it, given for the move and taken back."""
    target.parent.mkdir(parents=True, exist_ok=True)
    mode = stat.S_IMODE(os.lstat(source).st_mode)
    os.chmod(source, mode | stat.S_IWUSR)
    try:
        os.rename(source, target)
    finally:
        os.chmod(target if target.exists() else source, mode)


def archive(
    runs_dir: Path, target: str | Path, is_live: Callable[[str], bool] | None = None, force: bool = False
) -> Path:
    """Move an artifact under archived/; returns where it is now. is_live(dagster_run_id): whether that run is still
    going. force: archive even what others read (they then fail to find it until it is restored)."""
    directory = _artifact(runs_dir, target)
    try:
        run = read_manifest(directory).dagster_run_id
    except ManifestError:
        run = None
    if run and is_live is not None and is_live(run):
        raise ArchiveError(f"{directory}: Dagster run {run} that makes it is still going; cancel it first")
    users = referrers(runs_dir, directory)
    if users and not force:
        named = ", ".join(str(u.relative_to(Path(runs_dir) / "artifacts")) for u in users)
        raise ArchiveError(
            f"{directory.relative_to(Path(runs_dir) / 'artifacts')} is read by {named}: archive "
            f"{'them' if len(users) > 1 else 'it'} first (or pass --force)"
        )
    relative = directory.resolve().relative_to((Path(runs_dir) / "artifacts").resolve())
    destination = archived_root(runs_dir) / relative
    if destination.exists():
        raise ArchiveError(f"{destination} exists already: restore or remove it first")
    _move(directory, destination)
    return destination


def restore(runs_dir: Path, name: str | Path) -> Path:
    """Move an archived artifact back where it was (`<pipeline>/<stage>/<id>`, or its path under archived/)."""
    root = archived_root(runs_dir).resolve()
    path = Path(name)
    path = path.resolve() if path.is_absolute() else root / path
    try:
        relative = path.relative_to(root)
    except ValueError:
        raise ArchiveError(f"{name} is not under {root}") from None
    if len(relative.parts) != 3 or not path.is_dir():
        raise ArchiveError(f"{name} is not an archived artifact (`dragon runs --archived` lists them)")
    destination = Path(runs_dir) / "artifacts" / relative
    if destination.exists():
        raise ArchiveError(f"{destination} exists already: nothing restored")
    _move(path, destination)
    return destination


def archived(runs_dir: Path, pipeline: str | None = None) -> list[dict]:
    """The archived artifacts, newest first, as `list_artifacts` lists the others."""
    return list_artifacts(runs_dir, pipeline, folder=ARCHIVED)
