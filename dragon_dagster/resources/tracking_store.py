"""The MLflow store tracking writes to: reached once before use (a clear error when it does not answer), created
once (the default sqlite store), and kept relocatable (a runs directory moved or copied takes its experiments
along)."""

from __future__ import annotations

import fcntl
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..engine.outages import CONNECT_TIMEOUT_S, StoreUnavailable, check_tracking_store
from ..engine.release.model_registry import RegistryError, local_path
from ..engine.text.uris import without_password

logger = logging.getLogger(__name__)


class TrackingStoreError(StoreUnavailable, RegistryError):
    """The tracking URI names a database or a tracking server that cannot be reached, refuses the connection, or
    whose own database is down (one line naming the store, the setting, the host and the fix: engine/outages.py;
    a RegistryError too: the registry lives there, and whoever handles a registry that does not answer handles
    this)."""


class RelocatedStoreError(RuntimeError):
    """The MLflow store points its artifacts outside the runs directory, at a place that is not ours, or an
    experiment of ours could not be moved along with its runs directory."""


def check_store(uri: str, setting: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Reach the database or tracking server uri names once, within timeout_s. MLflow itself retries a store
    that does not answer for minutes (about 100 s for a database, 4 min for a server, and as long for a server
    whose database is down, which still answers /health), then fails with a traceback; this raises one
    TrackingStoreError naming the store, the setting the URI came from, the URI without its password, the host,
    the reason and the fix. A server is asked for one experiment, which reads its database. Other URIs (sqlite,
    a file store, databricks) are not checked."""
    check_tracking_store(uri, setting, TrackingStoreError, timeout_s)


def create_store_once(uri: str, lock_path: Path) -> None:
    """Create (migrate) a sqlite store under a file lock: two runs starting together on a new runs dir would
    otherwise both run MLflow's migrations on one database and one of them fail ("table ... already exists")."""
    from mlflow import MlflowClient

    with file_lock(lock_path):
        MlflowClient(uri).search_experiments(max_results=1)  # creates and migrates the tables if needed


def keep_relocatable(client, experiment, expected: str | None, root: Path, uri: str) -> None:
    """Keep the default store (uri, in the runs directory root) relocatable. MLflow stores absolute artifact
    locations, so a runs dir that was moved or copied still points at the old one: an experiment of ours (<old
    runs dir>/mlartifacts/<pipeline>) is moved onto expected, its runs with it; a location outside this runs dir
    that is not ours is refused, never written into silently. expected: where the experiment belongs (None: the
    store is the user's, and its locations are theirs)."""
    stored = experiment.artifact_location or ""
    if expected is None or stored == expected:
        return
    old = local_path(stored)
    if old is not None and (old == root or root in old.parents):
        return  # inside this runs dir: wherever it is, it moves with it
    if old is not None and old.name == experiment.name and old.parent.name == "mlartifacts":
        with file_lock(root / ".mlflow.db.lock"):  # one process moves it; the others find it moved
            runs = relocate_experiment(uri, experiment.experiment_id, stored, expected)
        check_relocated(client, experiment.experiment_id, stored)
        logger.warning(
            f"MLflow experiment {experiment.name!r} pointed at {stored}, under another runs directory (this one "
            f"was moved or copied): its artifact location and {runs} runs now point at {expected}"
        )
        return
    raise RelocatedStoreError(
        f"MLflow experiment {experiment.name!r} in {without_password(uri)} keeps its artifacts at {stored}, outside "
        f"the runs directory {root}: logging would write there, not into {expected}. Fix: delete or rename that "
        f"experiment (mlflow experiments delete/rename), or set the tracking resource's tracking_uri to the store "
        f"that owns {stored}."
    )


def relocate_experiment(uri: str, experiment_id: str, old: str, new: str) -> int:
    """Point an experiment, its runs and its logged models from the artifact location old to new, in the
    database store uri; returns how many runs moved. Idempotent: a second call finds nothing left at old.

    MLflow has no API for this: an experiment's, a run's and a logged model's artifact location are set when
    they are created and never change (mlflow/mlflow#2577, #3144, #8226: a new experiment is MLflow's answer, and
    it would leave the runs behind). The least fragile route is MLflow's own database store: its SqlAlchemyStore
    refuses a database whose schema is not the installed MLflow's, and its ORM models map the tables as this MLflow
    version has them, so no table or column name is spelled here and a renamed attribute is an AttributeError, not
    an UPDATE of nothing. check_relocated then reads the result back through the client API."""
    import sqlalchemy
    from mlflow.store.tracking.dbmodels.models import SqlExperiment, SqlLoggedModel, SqlRun
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    store = SqlAlchemyStore(uri, new)  # the engine is MLflow's, cached per URI and shared with its clients
    number = int(experiment_id)  # the stores keep experiment ids as integers; the API passes them as strings
    moved = 0
    with store.ManagedSessionMaker() as session:  # one transaction, committed on leaving
        session.query(SqlExperiment).filter(
            SqlExperiment.experiment_id == number, SqlExperiment.artifact_location == old
        ).update({SqlExperiment.artifact_location: new}, synchronize_session=False)
        for model, column in ((SqlRun, SqlRun.artifact_uri), (SqlLoggedModel, SqlLoggedModel.artifact_location)):
            # the prefix compared exactly (substr, not LIKE: sqlite's LIKE ignores case)
            under = sqlalchemy.or_(column == old, sqlalchemy.func.substr(column, 1, len(old) + 1) == old + "/")
            rest = sqlalchemy.func.substr(column, len(old) + 1, type_=sqlalchemy.String)
            count = (
                session.query(model)
                .filter(model.experiment_id == number, under)
                .update({column: sqlalchemy.literal(new, sqlalchemy.String) + rest}, synchronize_session=False)
            )
            moved += count if model is SqlRun else 0
    _forget_artifact_repositories()
    return moved


def check_relocated(client, experiment_id: str, old: str) -> None:
    """Read an experiment moved off old back through the client API: the experiment, every run (deleted ones
    too) and every logged model must have left it. A MLflow release that keeps an artifact location somewhere
    relocate_experiment does not reach fails here, naming what stayed behind, not later by logging into the
    old runs directory."""
    import mlflow
    from mlflow.entities import ViewType

    def at_old(location: str | None) -> bool:
        return bool(location) and (location == old or location.startswith(old + "/"))

    stayed = ["the experiment"] if at_old(client.get_experiment(experiment_id).artifact_location) else []
    token = None
    while True:
        runs = client.search_runs([experiment_id], run_view_type=ViewType.ALL, max_results=1000, page_token=token)
        stayed += [f"run {run.info.run_id}" for run in runs if at_old(run.info.artifact_uri)]
        token = runs.token
        if not token:
            break
    while True:
        models = client.search_logged_models([experiment_id], max_results=100, page_token=token)
        stayed += [f"logged model {model.model_id}" for model in models if at_old(model.artifact_location)]
        token = models.token
        if not token:
            break
    if stayed:
        raise RelocatedStoreError(
            f"MLflow {mlflow.__version__} still points {len(stayed)} artifact location(s) of experiment "
            f"{experiment_id} at {old} after moving it ({', '.join(stayed[:5])}): this MLflow keeps them where "
            f"resources/tracking_store.py's relocate_experiment does not reach. Fix: use the runs directory at its "
            f"old place, or a MLflow version this project pins (constraints.txt)."
        )


def _forget_artifact_repositories() -> None:
    """The client caches each run's artifact repository (its location) by run id, for the life of the process,
    and has no API to drop it: the cache is MLflow's private module state, cleared when it is there."""
    try:
        from mlflow.tracking._tracking_service import utils

        utils._artifact_repos_cache.clear()
    except (ImportError, AttributeError):
        pass


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive file lock on path (created) held within the block: between processes, not threads."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
