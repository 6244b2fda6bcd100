"""Where artifacts, checkpoints and the MLflow store live: the runs directory."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from dagster import ConfigurableResource
from pydantic import Field

from ..engine.artifacts.checkpoints import checkpoint_problem, checkpoint_step
from ..engine.artifacts.directories import STAGING_PREFIX, new_artifact_path, remove_tree, staged_dir, staging_owner
from ..engine.runtime import remote

logger = logging.getLogger(__name__)


def default_runs_dir() -> Path:
    return Path(os.environ.get("DRAGON_RUNS_DIR", Path.cwd() / "runs")).resolve()


def _newest_mtime(path: Path) -> float:
    """The latest modification time of path or anything under it: when a staging directory was last written."""
    newest = path.lstat().st_mtime
    for dirpath, _dirs, files in os.walk(path):
        for name in [*files, "."]:
            try:
                newest = max(newest, os.lstat(os.path.join(dirpath, name)).st_mtime)
            except FileNotFoundError:
                pass
    return newest


class ArtifactStore(ConfigurableResource):
    """Immutable artifact directories under a runs directory, one per materialization."""

    runs_dir: str = Field(
        default="",
        description="Root of artifacts, checkpoints and the MLflow store. Empty: $DRAGON_RUNS_DIR, else ./runs.",
    )
    artifact_uri: str = Field(
        default="",
        description="Where finished artifacts live for every node, e.g. s3://bucket/prefix or "
        "file:///mnt/shared/artifacts: each is published to <artifact_uri>/<pipeline>/<stage>/"
        "<name>/ (files, then a .complete marker) and runs_dir/artifacts is its local cache. "
        "Credentials and endpoints come from the environment only (AWS_ACCESS_KEY_ID, "
        "AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL, ...). Empty: local artifacts only.",
    )

    @property
    def root(self) -> Path:
        return Path(self.runs_dir).resolve() if self.runs_dir else default_runs_dir()

    @property
    def artifacts_root(self) -> Path:
        return self.root / "artifacts"

    @contextmanager
    def new_artifact(self, pipeline: str, stage: str, run_id: str) -> Iterator[tuple[Path, Path]]:
        """(staging dir to write into, final path it becomes when the block succeeds). The staging directory's
        name carries run_id (clean_stale_staging asks whether that run is alive); the final one is read-only.

        With artifact_uri, the finished directory is published to uri_for(final) before it is renamed locally:
        an upload that fails fails the block (RemoteStoreError naming the URI) and leaves no artifact, local
        or remote; the local one is the Dagster side's cache of the remote one."""
        final = new_artifact_path(self.artifacts_root, pipeline, stage, run_id)
        with staged_dir(final, owner=run_id) as tmp:
            yield tmp, final
            if self.artifact_uri:
                remote.publish_dir(tmp, self.uri_for(final), replace_incomplete=False)

    def uri_for(self, path: str | Path) -> str | None:
        """The URI of a local artifact path (or of a file inside one) in artifact_uri; None without
        artifact_uri or for a path outside runs_dir/artifacts."""
        if not self.artifact_uri:
            return None
        rel = self._relative(path)
        return None if rel is None else remote.join(self.artifact_uri, rel.as_posix())

    def _relative(self, path: str | Path) -> Path | None:
        root = self.artifacts_root.resolve()
        path = Path(path).resolve()
        return path.relative_to(root) if root in path.parents else None

    def staging_uri(self, final: str | Path, run_id: str) -> str:
        """Where a worker on another node writes the output for the artifact final (engine/remote.py
        remote_job, collect): <artifact_uri>/.staging/<run_id>/<pipeline>/<stage>/<name>-<nonce>."""
        rel = self._relative(final)
        if not self.artifact_uri or rel is None:
            raise ValueError(f"no staging URI for {final}: artifact_uri is {self.artifact_uri!r}")
        return remote.staging_uri(self.artifact_uri, _one_name(run_id), rel.as_posix())

    def local(self, path_or_uri: str | Path) -> Path:
        """A local path for an artifact (or a file inside one): the path itself when it is there; else, for a
        path under runs_dir/artifacts (its local copy gone: another machine, a cleaned cache) or a URI under
        artifact_uri, the complete remote artifact downloaded into runs_dir/artifacts (staged, renamed,
        read-only). RemoteStoreError naming the URI when there is no complete artifact there."""
        value = str(path_or_uri)
        if remote.is_uri(value):
            base = self.artifact_uri.rstrip("/")
            if not base or not value.startswith(base + "/"):
                raise ValueError(f"{value} is not under this store's artifact_uri ({self.artifact_uri or 'unset'})")
            rel = Path(value[len(base) + 1 :].strip("/"))
        else:
            if Path(value).exists():
                return Path(value)
            rel = self._relative(value)
            if rel is None or not self.artifact_uri:
                raise FileNotFoundError(
                    f"no artifact at {value}" + ("" if self.artifact_uri else " (and no artifact_uri to fetch it from)")
                )
        parts = rel.parts
        if len(parts) < remote.ARTIFACT_DEPTH or ".." in parts or parts[0].startswith("."):
            raise ValueError(f"{path_or_uri} names no artifact (<pipeline>/<stage>/<name>/...)")
        artifact = Path(*parts[: remote.ARTIFACT_DEPTH])
        local = remote.fetch_dir(remote.join(self.artifact_uri, artifact.as_posix()), self.artifacts_root / artifact)
        return local.joinpath(*parts[remote.ARTIFACT_DEPTH :])

    def clean_stale_staging(
        self,
        is_live: Callable[[str], bool],
        min_age_s: float = 600,
        unowned_min_age_s: float = 86400,
        log: Callable[[str], None] | None = None,
    ) -> list[Path]:
        """Remove the staging leftovers of killed writes; returns what it removed.

        A `.tmp-*` directory under artifacts/<pipeline>/<stage>/ goes when the run its name carries is not live
        (is_live(run_id) is False) and nothing in it was written for min_age_s. One whose name carries no run
        (older staging names) goes after unowned_min_age_s without a write. is_live raising keeps the directory.
        """
        log = log or logger.warning
        now, removed, verdicts = time.time(), [], {}
        candidates = list((self.root / "artifacts").glob(f"*/*/{STAGING_PREFIX}*"))
        for path in candidates:
            owner = staging_owner(path.name) if path.is_dir() else None
            try:
                idle = now - _newest_mtime(path)
            except FileNotFoundError:  # finished or removed in the meantime
                continue
            if owner is None:
                if idle < unowned_min_age_s:
                    continue
            else:
                if idle < min_age_s:
                    continue
                if owner not in verdicts:
                    try:
                        verdicts[owner] = bool(is_live(owner))
                    except Exception as exc:  # unknown: keep it
                        log(f"keeping {path}: could not tell whether run {owner} is live ({exc})")
                        verdicts[owner] = True
                if verdicts[owner]:
                    continue
            try:
                remove_tree(path)
            except OSError as exc:
                log(f"could not remove stale staging {path}: {exc}")
                continue
            log(f"removed stale staging {path} (run {owner or 'unknown'}, idle {idle / 60:.0f} min)")
            removed.append(path)
        return removed

    def feedback_path(self, pipeline: str) -> Path:
        """The pipeline's chat feedback store (append-only SQLite, WAL)."""
        return self.root / "feedback" / f"{pipeline}.sqlite"

    def checkpoints_root(self, pipeline: str, stage: str) -> Path:
        """checkpoints/<pipeline>/<stage>: one directory per Dagster run below it."""
        return self.root / "checkpoints" / pipeline / stage

    def checkpoint_dir(self, pipeline: str, stage: str, run_id: str) -> Path:
        path = self.checkpoints_root(pipeline, stage) / _one_name(run_id)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def latest_checkpoint(
        self,
        pipeline: str,
        stage: str,
        log: Callable[[str], None] | None = None,
        is_live: Callable[[str], bool] | None = None,
    ) -> Path | None:
        """The newest complete checkpoint any earlier run of this stage left behind (cancelled, failed, killed).

        Newest by modification time, then step. Incomplete ones (a kill during the save: no trainer_state.json,
        no weights, ...) are skipped and named through log. is_live: runs still training are skipped too, as
        their checkpoints are still being written and rotated.
        """
        log = log or logger.warning
        found = [
            p for p in self.checkpoints_root(pipeline, stage).glob("*/checkpoint-*") if checkpoint_step(p) is not None
        ]

        def newest_first(path: Path) -> tuple[float, int]:
            try:
                return path.stat().st_mtime, checkpoint_step(path)
            except FileNotFoundError:
                return 0.0, -1

        live: dict[str, bool] = {}
        for path in sorted(found, key=newest_first, reverse=True):
            run = path.parent.name
            if is_live is not None:
                if run not in live:
                    live[run] = bool(is_live(run))
                if live[run]:
                    continue
            problem = checkpoint_problem(path)
            if problem is None:
                return path
            log(f"skipping incomplete checkpoint {path}: {problem}")
        return None

    def discard_checkpoints(
        self, pipeline: str, stage: str, run_id: str, resumed_from: str | Path | None = None
    ) -> list[Path]:
        """Delete run_id's checkpoint directory, and with resumed_from (a checkpoint this run resumed from) the
        directory of the run that wrote it; never any other run's. Returns the directories removed."""
        base = self.checkpoints_root(pipeline, stage)
        owners = [_one_name(run_id)]
        if resumed_from:
            source = Path(resumed_from).resolve()
            if base.resolve() in source.parents:  # checkpoints/<pipeline>/<stage>/<run>/checkpoint-N
                owners.append(source.relative_to(base.resolve()).parts[0])
            else:
                logger.warning(f"not deleting {resumed_from}: it is not under {base}")
        removed = []
        for owner in dict.fromkeys(owners):
            path = base / owner
            if path.exists():
                remove_tree(path)
                removed.append(path)
        return removed


def _one_name(run_id: str) -> str:
    """run_id as one path component: nothing that could reach another run's directory."""
    if not run_id or run_id in (".", "..") or "/" in run_id or "\\" in run_id or "\0" in run_id:
        raise ValueError(f"not a run id: {run_id!r}")
    return run_id
