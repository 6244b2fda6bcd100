"""Where artifacts, checkpoints and the MLflow store live: the runs directory."""

from __future__ import annotations

import logging
import os
import re
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from dagster import ConfigurableResource
from pydantic import Field

from ..engine.artifacts.checkpoints import checkpoint_problem, checkpoint_step
from ..engine.artifacts.directories import (
    STAGING_PREFIX,
    dir_size,
    new_artifact_path,
    remove_tree,
    staged_dir,
    staging_owner,
)
from ..engine.data.feedback.opener import open_feedback_store
from ..engine.data.feedback.store import FeedbackStore
from ..engine.runtime import remote

logger = logging.getLogger(__name__)

# Under the runs directory: the Dagster Pipes files of subprocess workers, .pipes/<run_id>/<step>-<nonce>/.
PIPES_DIR = ".pipes"
# The feedback store's URL when ArtifactStore.feedback_url is empty: what chat servers and Dagster both read
FEEDBACK_URL_ENV = "DRAGON_FEEDBACK_URL"


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


def _idle_s(path: Path, now: float) -> float | None:
    """Seconds since anything under path was written; None when path is gone (finished or removed meanwhile)."""
    try:
        return now - _newest_mtime(path)
    except FileNotFoundError:
        return None


def _live_or_unknown(is_live: Callable[[str], bool], log: Callable[[str], None]) -> Callable[[str], bool]:
    """is_live asked once per run. A run it cannot answer for (is_live raises) counts as live, so that its files
    are kept: a cleanup must never remove what a run still uses."""
    verdicts: dict[str, bool] = {}

    def live(run_id: str) -> bool:
        if run_id not in verdicts:
            try:
                verdicts[run_id] = bool(is_live(run_id))
            except Exception as exc:  # unknown: keep its files
                log(f"keeping the files of run {run_id}: could not tell whether it is live ({exc})")
                verdicts[run_id] = True
        return verdicts[run_id]

    return live


def _remove(path: Path, what: str, why: str, log: Callable[[str], None]) -> bool:
    """Remove path and log what it was, why it went and the space freed; False (the failure logged) when it could
    not be removed."""
    try:
        size = dir_size(path)
        freed = f"{size / 2**20:.1f} MiB freed" if size >= 2**20 else f"{size / 2**10:.0f} KiB freed"
    except OSError:  # a file went meanwhile: the size is only for the log
        freed = "size unknown"
    try:
        remove_tree(path)
    except OSError as exc:
        log(f"could not remove {what} {path}: {exc}")
        return False
    log(f"removed {what} {path}: {why}; {freed}")
    return True


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
    feedback_url: str = Field(
        default="",
        description="Where chat feedback is kept. Empty: $DRAGON_FEEDBACK_URL when set, else one SQLite file "
        "per pipeline under runs_dir/feedback/. A postgresql://user@host:port/database URL keeps it in "
        "PostgreSQL (a schema per pipeline), shared by chat servers on several machines. Keep the password "
        "out of files: leave it out of the URL and set PGPASSWORD or ~/.pgpass, or give the whole URL as "
        "EnvVar('DRAGON_FEEDBACK_URL').",
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

    def clean_leftovers(
        self, is_live: Callable[[str], bool], min_age_s: float = 600, log: Callable[[str], None] | None = None
    ) -> list[Path]:
        """Remove what killed runs left behind and nothing will use again, each removal logged with the space it
        freed: staging directories (clean_stale_staging), checkpoints no resume would pick
        (clean_stale_checkpoints) and Pipes folders (clean_stale_pipes). Returns what it removed."""
        log = log or logger.warning
        live = _live_or_unknown(is_live, log)  # one question per run for all three
        return [
            *self.clean_stale_staging(live, min_age_s, log=log),
            *self.clean_stale_checkpoints(live, min_age_s, log=log),
            *self.clean_stale_pipes(live, min_age_s, log=log),
        ]

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
        live = _live_or_unknown(is_live, log)
        now, removed = time.time(), []
        for path in list((self.root / "artifacts").glob(f"*/*/{STAGING_PREFIX}*")):
            owner = staging_owner(path.name) if path.is_dir() else None
            idle = _idle_s(path, now)
            if idle is None or idle < (min_age_s if owner else unowned_min_age_s):
                continue
            if owner is not None and live(owner):
                continue
            run = f"run {owner} is over" if owner else "its name carries no run"
            if _remove(path, "stale staging", f"{run}, idle {idle / 60:.0f} min", log):
                removed.append(path)
        return removed

    def clean_stale_checkpoints(
        self, is_live: Callable[[str], bool], min_age_s: float = 600, log: Callable[[str], None] | None = None
    ) -> list[Path]:
        """Remove the checkpoint directories of runs that can no longer be resumed; returns what it removed.

        The rule: checkpoints/<pipeline>/<stage>/<run_id>/ goes when its run is not live, nothing in it was
        written for min_age_s, and it does not hold the checkpoint that `resume: true` would pick now
        (latest_checkpoint: the newest complete checkpoint of a run that is not live). That pick is always kept,
        and so is every live run's directory. Resume never picks another: an older directory would become the
        pick only once the newer one is gone, which happens when the run that resumed from it saved the stage's
        adapter (discard_checkpoints), and resuming from the older one then would go back behind that adapter;
        a directory without a complete checkpoint (a kill before the first save finished) is never picked.
        """
        log = log or logger.warning
        live = _live_or_unknown(is_live, log)
        now, removed = time.time(), []
        for stage_dir in sorted(p for p in (self.root / "checkpoints").glob("*/*") if p.is_dir()):
            pipeline, stage = stage_dir.parent.name, stage_dir.name
            pick = self.latest_checkpoint(pipeline, stage, log=lambda _line: None, is_live=live)
            why = f"resume would pick {pick} instead" if pick else "no complete checkpoint is left to resume from"
            for run_dir in sorted(p for p in stage_dir.iterdir() if p.is_dir()):
                if pick is not None and pick.parent == run_dir:
                    continue
                idle = _idle_s(run_dir, now)
                if idle is None or idle < min_age_s or live(run_dir.name):
                    continue
                if _remove(run_dir, "checkpoints", f"run {run_dir.name} is over and {why}", log):
                    removed.append(run_dir)
        return removed

    @property
    def pipes_root(self) -> Path:
        """Where subprocess workers' Dagster Pipes files live, one folder per run: in the runs directory, not the
        system temp directory, so that what a step killed -9 leaves is found by clean_stale_pipes."""
        return self.root / PIPES_DIR

    def new_pipes_dir(self, run_id: str, step: str) -> Path:
        """A fresh folder name (not created) for one worker's Pipes files: .pipes/<run_id>/<step>-<nonce>."""
        step = re.sub(r"[^A-Za-z0-9_.-]", "_", step)[:100].lstrip(".") or "step"
        return self.pipes_root / _one_name(run_id) / f"{step}-{secrets.token_hex(3)}"

    def clean_stale_pipes(
        self, is_live: Callable[[str], bool], min_age_s: float = 600, log: Callable[[str], None] | None = None
    ) -> list[Path]:
        """Remove the Pipes folders (.pipes/<run_id>/) of runs that are not live and wrote nothing there for
        min_age_s: a step that ends removes its own folder, one killed -9 leaves it. Returns what it removed."""
        log = log or logger.warning
        live = _live_or_unknown(is_live, log)
        now, removed = time.time(), []
        for run_dir in sorted(p for p in self.pipes_root.glob("*") if p.is_dir()):
            idle = _idle_s(run_dir, now)
            if idle is None or idle < min_age_s or live(run_dir.name):
                continue
            if _remove(run_dir, "Pipes files", f"run {run_dir.name} is over, idle {idle / 60:.0f} min", log):
                removed.append(run_dir)
        return removed

    def feedback_path(self, pipeline: str) -> Path:
        """The pipeline's SQLite chat feedback store (append-only, WAL), used when no feedback URL is set."""
        return self.root / "feedback" / f"{pipeline}.sqlite"

    def feedback_store(self, pipeline: str, ride_out_s: float = 60.0) -> FeedbackStore:
        """The pipeline's chat feedback store: in PostgreSQL when feedback_url (or $DRAGON_FEEDBACK_URL) is a
        postgresql:// URL, else the SQLite file at feedback_path. ride_out_s: how long a PostgreSQL store, once
        reached, retries a server that went away (a restart) before its error."""
        if self.feedback_url:
            url, setting = self.feedback_url, "ArtifactStore.feedback_url"
        else:
            url, setting = os.environ.get(FEEDBACK_URL_ENV, ""), f"${FEEDBACK_URL_ENV}"
        return open_feedback_store(url, pipeline, self.feedback_path(pipeline), setting=setting, timeout=ride_out_s)

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
