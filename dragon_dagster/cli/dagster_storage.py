"""Dagster's instance storage, reached once before a command uses it.

Why: with PostgreSQL storage (instance/postgres-storage.yaml) and the database down, dagster-postgres logs six
retry warnings over about 6 s and ends in a 199-line traceback, `DagsterPostgresException: too many retries for DB
connection`, naming neither the setting nor the host; a wrong password reads the same, and a database whose user
may not create tables fails later with `permission denied for schema public`. One bounded connection first makes
each of these one line naming the store, the setting, the host and the fix (engine/outages.py), within seconds.
SQLite storage (files in $DAGSTER_HOME, the default) has nothing to reach and is not checked.

Why dagster.yaml is read here rather than through Dagster's InstanceRef: importing dagster and dagster-postgres
takes 3 to 6 s on a busy 2-core machine, most of the time a command has to say the database is down. The
storage's PostgreSQL settings are two documented forms (`postgres_url`, or `postgres_db`'s fields, each a value or
`{env: NAME}`), and tests/test_dagster_storage.py holds the URLs read here to the ones dagster-postgres builds.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import quote, urlencode

import yaml

from ..engine.outages import CONNECT_TIMEOUT_S, StoreUnavailable, check_database

STORE = "Dagster's instance storage"
# a storage's module (a `storage:` block names its kind instead: `postgres`)
POSTGRES_MODULE = "dagster_postgres"
# Dagster creates its tables on first use: a user that may not (on PostgreSQL 15, one that does not own the
# database) fails there, deep in a traceback. NULL when the tables exist or may be created.
CAN_CREATE = """SELECT CASE WHEN to_regclass('runs') IS NULL
  AND NOT has_schema_privilege(current_user, COALESCE(current_schema(), 'public'), 'CREATE')
  THEN 'permission denied: user ' || current_user || ' may not create tables in schema '
    || COALESCE(current_schema(), 'public') || ' of database ' || current_database()
    || ', and Dagster creates its tables on first use' END"""


class DagsterStorageError(StoreUnavailable):
    """Dagster's instance storage cannot be used: one line naming the setting, the host and the fix."""


def _value(value, where: str):
    """A config value as Dagster reads it: itself, or the environment variable `{env: NAME}` names."""
    if isinstance(value, dict) and set(value) == {"env"}:
        name = value["env"]
        if not os.environ.get(name):
            raise DagsterStorageError(
                STORE,
                f"${name}",
                "",
                "",
                f"${name} is not set, and {where} reads the database's URL from it",
                f"set {name}=postgresql+psycopg2://USER:PASSWORD@HOST:5432/DATABASE (docs/operations/deployment.md)",
            )
        return os.environ[name]
    return value


def _postgres(config: dict, where: str) -> tuple[str, str] | None:
    """(URL, the setting that names it) of one PostgreSQL storage's config; None when it signs in through a
    cloud provider (no password to check)."""
    if not isinstance(config, dict) or config.get("auth_provider"):
        return None
    if config.get("postgres_url") is not None:
        raw = config["postgres_url"]
        setting = f"${raw['env']}" if isinstance(raw, dict) and "env" in raw else f"postgres_url in {where}"
        return str(_value(raw, where)), setting
    db = {k: _value(v, where) for k, v in (config.get("postgres_db") or {}).items()}
    if not db:
        return None
    user, password = quote(str(db.get("username", ""))), str(db.get("password") or "")
    userinfo = f"{user}:{quote(password)}" if password else user
    url = (
        f"{db.get('scheme', 'postgresql')}://{userinfo}@{db.get('hostname', '')}:{db.get('port', 5432)}/"
        f"{db.get('db_name', '')}"
    )
    params = db.get("params") or {}
    return (f"{url}?{urlencode(params, quote_via=quote)}" if params else url), f"postgres_db in {where}"


def postgres_storage(home: Path) -> list[tuple[str, str]]:
    """(URL, the setting it comes from) of each PostgreSQL storage home/dagster.yaml configures: one for
    `storage: postgres:`, one per store when run, event log and schedule storage are set apart; empty for any
    other storage. Raises DagsterStorageError when a URL's environment variable is unset."""
    path = home / "dagster.yaml"
    settings = (yaml.safe_load(path.read_text()) if path.exists() else None) or {}
    where = str(path)
    configs = []
    storage = settings.get("storage")
    if isinstance(storage, dict) and "postgres" in storage:
        configs.append(storage["postgres"])
    for key in ("run_storage", "event_log_storage", "schedule_storage"):
        block = settings.get(key)
        if isinstance(block, dict) and str(block.get("module", "")).startswith(POSTGRES_MODULE):
            configs.append(block.get("config"))
    found: dict[str, str] = {}
    for config in configs:
        pair = _postgres(config, where)
        if pair is not None:
            found.setdefault(*pair)
    return list(found.items())


def check_dagster_storage(home: Path | None = None, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Reach the PostgreSQL storage of the Dagster instance at home ($DAGSTER_HOME) once, within timeout_s
    each; raise DagsterStorageError when it is down, refuses the login, or its user may not create Dagster's
    tables. Any other storage is not checked."""
    home = Path(home or os.environ["DAGSTER_HOME"])
    for url, setting in postgres_storage(home):
        check_database(url, setting, STORE, DagsterStorageError, timeout_s, query=CAN_CREATE)
