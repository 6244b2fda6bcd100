"""A store that is down or refuses the login, said in one line within seconds: which store, the setting that names
it, its host, why, and the fix.

Why this exists: every client of a store retries on its own and then fails in its own words. dagster-postgres
logs six retry warnings over about 6 s and ends in a 199-line traceback (`too many retries for DB connection`);
MLflow's client retries a server whose database is down for about 250 s (`too many 503 error responses`), and its
server stays up meanwhile, so a check that the server answers at all passes; libpq waits for as long as the
operating system lets it on a host that drops packets. None of them names the setting to change. So each store
is reached once, bounded (`CONNECT_TIMEOUT_S`, one request with no retry), before the work that needs it, and
what went wrong is a `StoreUnavailable`: its message is the one line, its attributes the parts.

Who raises one: the feedback store (data/feedback/postgres.py), MLflow's tracking store, a database or a tracking
server and the database behind it (resources/tracking.py), and Dagster's instance storage
(cli/dagster_storage.py). The `dragon` command prints the line (`--debug`: the traceback, cli/group.py), the
chat page shows it in its status line, the chat server's console prints it. The lowest layer, so that every store
above says it the same way; framework-free: nothing here imports Dagster.
"""

from __future__ import annotations

import configparser
import os
import re
from pathlib import Path
from urllib.parse import urlsplit

from .text.uris import scrub, without_password

CONNECT_TIMEOUT_S = 5  # for one connection or one request: a host that drops packets costs this, not minutes
SERVERS = {"postgresql": "PostgreSQL", "mysql": "MySQL", "mssql": "SQL Server"}  # a database URI's server, by scheme
MLFLOW_PROBE = "/api/2.0/mlflow/experiments/search"  # cheap, and it reads the server's database

# what a driver adds around the reason, which the line says better itself (the host) or replaces (the hint)
_NOISE = (
    r"\(Background on this error at: [^)]*\)",
    r"^\([\w.]+\)\s*",  # SQLAlchemy's "(psycopg2.OperationalError) "
    r"Is the server running on that host and accepting TCP/IP connections\?",
    r"\bFATAL:\s*",
)
# libpq's "connection to server at "host" (address), port N failed:", once per address it tried
_ATTEMPT = r'(?:connection failed:\s*)?connection to server (?:at "[^"]*"(?: \([^)]*\))?, port \d+|on socket "[^"]*")'
_ATTEMPT += r" failed:\s*"


class StoreUnavailable(Exception):
    """A store that cannot be used now: `store` (what it is, for people), `setting` (what names it: an
    environment variable or a resource's field), `uri` (shown without its password), `host` (host:port), `reason`
    (the driver's or the server's words, without the password) and `fix`. str() is the one line."""

    def __init__(self, store: str, setting: str, uri: str, host: str, reason: str, fix: str):
        self.store, self.setting, self.uri, self.host = store, setting, without_password(uri), host
        self.reason = scrub(reason, uri)
        self.fix = fix
        where = f" on {host}" if host else ""
        named = f"{setting}: {self.uri}" if uri else setting
        super().__init__(f"{store}{where} ({named}): {self.reason}. Fix: {fix}.")

    def __reduce__(self):  # the parts, not the line, are its arguments (a pickled copy is the same error)
        return (type(self), (self.store, self.setting, self.uri, self.host, self.reason, self.fix))

    @classmethod
    def of(
        cls,
        store: str,
        setting: str,
        uri: str,
        detail: str,
        server: str = "PostgreSQL",
        host: str | None = None,
        fix_in: str | None = None,
    ) -> StoreUnavailable:
        """The error for a driver's or a server's message `detail` about the store at `uri`: the reason is
        `detail` without the driver's noise, the fix follows from it. server: what runs there ("PostgreSQL");
        host: where, when `uri` does not say (default: uri's host:port); fix_in: where the fix is made, when
        that is not `setting` (a server's own settings)."""
        host = host or host_of(uri)
        reason = short_reason(scrub(detail, uri))
        return cls(store, setting, uri, host, reason, fix_for(reason, fix_in or setting, host, server))


def host_of(uri: str) -> str:
    """host:port of a URI, for a message."""
    parts = urlsplit(uri)
    try:
        port = parts.port
    except ValueError:
        port = None
    return f"{parts.hostname or 'localhost'}{f':{port}' if port else ''}"


def short_reason(detail: str) -> str:
    """A driver's message as one short line: its own wrapping (SQLAlchemy's prefix and link, libpq's hint and
    "connection to server at ... failed:" before each address it tried) taken off, repeats said once."""
    text = " ".join(str(detail).split())
    for noise in _NOISE:
        text = re.sub(noise, " ", text).strip()
    pieces = [p.strip(" .;") for p in re.split(_ATTEMPT, text)]
    return "; ".join(dict.fromkeys(p for p in pieces if p)) or "no reason given"


def fix_for(reason: str, setting: str, host: str, server: str) -> str:
    """What to do about `reason` (a short_reason) at the store on host, whose URL is in `setting`."""
    said = reason.lower()
    if "password authentication failed" in said or "authentication failed" in said:
        return f"correct the user or password in {setting} (a password percent-encoded in a URL)"
    if "no pg_hba.conf entry" in said:
        return f"allow this host for that user and database in {server}'s pg_hba.conf on {host}, or correct {setting}"
    if re.search(r'role "[^"]*" does not exist', said):
        return f"create that user on {host}, or correct the user in {setting}"
    if re.search(r'database "[^"]*" does not exist', said):
        return f"create the database on {host} (docs/operations/deployment.md), or correct its name in {setting}"
    if "permission denied" in said:
        return f"make the user in {setting} the owner of its database on {host}, or grant it what the message names"
    if "connection refused" in said:
        return f"start {server} on {host}, or correct the host and port in {setting}"
    if any(w in said for w in ("timeout", "timed out", "no answer within", "no connection within")):
        return f"check that {host} is up and reachable from this machine (a firewall?), or correct {setting}"
    if any(w in said for w in ("translate host name", "name or service not known", "name resolution", "servname")):
        return f"correct the host name in {setting}"
    return f"check {server} on {host} (its log says more), and {setting}"


# ------------------------------------------------------------------------------------------------------ probes


def check_tracking_store(
    uri: str, setting: str, error: type[StoreUnavailable] = StoreUnavailable, timeout_s: float = CONNECT_TIMEOUT_S
) -> None:
    """Reach MLflow's tracking store at uri once: a database (one connection) or a tracking server (one request
    that reads its database). Other URIs (sqlite, a file store, databricks) have nothing to reach here."""
    scheme = urlsplit(uri).scheme.lower()
    if scheme.split("+")[0] in SERVERS:
        check_database(uri, setting, "MLflow's database", error, timeout_s)
    elif scheme in ("http", "https"):
        check_tracking_server(uri, setting, error, timeout_s)


def check_database(
    uri: str,
    setting: str,
    store: str,
    error: type[StoreUnavailable] = StoreUnavailable,
    timeout_s: float = CONNECT_TIMEOUT_S,
    query: str | None = None,
) -> None:
    """Open one connection to the database at uri (a SQLAlchemy URL) within timeout_s; raise `error` naming the
    store and the setting when that fails. query: SQL run on that connection whose one value, when not NULL,
    says what else is wrong (a user that may not create the tables the store needs, say)."""
    import sqlalchemy
    from sqlalchemy.pool import NullPool

    server = SERVERS.get(urlsplit(uri).scheme.lower().split("+")[0], "the database server")
    try:
        url = sqlalchemy.engine.make_url(uri)
        connect_args = {}
        if url.get_backend_name() in ("postgresql", "mysql") and "connect_timeout" not in url.query:
            connect_args["connect_timeout"] = max(2, int(timeout_s))  # libpq's and MySQL's, in whole seconds
        engine = sqlalchemy.create_engine(url, poolclass=NullPool, connect_args=connect_args)
    except ImportError as exc:
        problem = f"its driver is not installed ({exc})"
        raise error(store, setting, uri, host_of(uri), problem, _driver_fix(uri)) from None
    except Exception as exc:  # noqa: BLE001 - a URL SQLAlchemy cannot read
        raise error(
            store, setting, uri, host_of(uri), f"{type(exc).__name__}: {exc}", f"correct the URL in {setting}"
        ) from None
    try:
        with engine.connect() as conn:
            found = conn.execute(sqlalchemy.text(query)).scalar() if query else None
        if found is None:
            return
        detail = str(found)
    except Exception as exc:  # noqa: BLE001 - the DBAPI's error, whatever the driver
        detail = str(getattr(exc, "orig", None) or exc)
    finally:
        engine.dispose()
    raise error.of(store, setting, uri, detail, server)


def _driver_fix(uri: str) -> str:
    if urlsplit(uri).scheme.lower().startswith("postgresql"):
        return "pip install 'dragon-dagster[postgres]' (psycopg and psycopg2) where this runs"
    return "install the database driver the URL's scheme names"


def check_tracking_server(
    uri: str, setting: str, error: type[StoreUnavailable] = StoreUnavailable, timeout_s: float = CONNECT_TIMEOUT_S
) -> None:
    """Ask the MLflow tracking server at uri for one experiment, once, within timeout_s, with the credentials
    MLflow's client would send: a real request that reads the server's database, since the server stays up (and
    answers /health) while its database is down. Raise `error` when the server does not answer, refuses the
    credentials, is not an MLflow server, or answers that its database is unavailable (then naming the
    database's host, from the server's message). A TLS failure is MLflow's own to report."""
    import requests

    store = "MLflow's tracking server"
    try:
        response = _probe(uri, timeout_s)
    except requests.exceptions.SSLError:
        return
    except requests.exceptions.ConnectTimeout:
        raise error.of(
            store, setting, uri, f"no connection within {timeout_s:g} s", "the MLflow tracking server"
        ) from None
    except requests.exceptions.Timeout:
        detail = f"connected, but no answer within {timeout_s:g} s"
        raise error.of(store, setting, uri, detail, "the MLflow tracking server") from None
    except requests.RequestException as exc:
        errno = re.search(r"\[Errno -?\d+\] ([^\"')]+)", str(exc))  # urllib3 wraps the socket's reason deep inside
        detail = errno.group(1).strip() if errno else f"{type(exc).__name__}: {exc}"
        raise error.of(store, setting, uri, detail, "the MLflow tracking server") from None
    status = response.status_code
    if status < 400:
        return
    message = _server_message(response)
    if status in (401, 403):
        raise error(
            store,
            setting,
            uri,
            host_of(uri),
            f"it refused the credentials (HTTP {status}: {message})",
            "set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN) to a user the "
            "server accepts",
        )
    if status == 404:
        raise error(
            store,
            setting,
            uri,
            host_of(uri),
            f"no MLflow API there (HTTP 404 on {MLFLOW_PROBE})",
            f"correct {setting}: the MLflow server's address, as `mlflow server` prints it",
        )
    if status >= 500:
        at = re.search(r'server at "([^"]+)"(?: \([^)]*\))?, port (\d+)', message)
        database = at and f"{at.group(1)}:{at.group(2)}"
        if status == 503 or database:  # MLflow's TEMPORARILY_UNAVAILABLE: its store's connection failed
            database = database or "the server's database host"
            reason = short_reason(message)
            raise error(
                f"MLflow's database behind the tracking server {host_of(uri)}",
                setting,
                uri,
                database,
                f"the server answers {status}: {reason}",
                fix_for(
                    reason,
                    "the MLflow server's backend store URI (MLFLOW_BACKEND_STORE_URI; then restart the server)",
                    database,
                    "the MLflow server's database",
                ),
            )
        raise error(
            store, setting, uri, host_of(uri), f"it answers HTTP {status}: {message}", "see the MLflow server's log"
        )


def _probe(uri: str, timeout_s: float):
    """One GET of MLFLOW_PROBE, no retry. Why not MLflow's own request: importing mlflow takes 3 s of CPU (10 s
    on a busy 2-core machine), most of the time a command has to say the server is down; MLflow's credentials
    (user and password, or token; from the environment or ~/.mlflow/credentials) and TLS settings are read as
    its client reads them. An auth plugin, AWS SigV4 or a workspace goes through MLflow's request after all."""
    import requests

    env = os.environ.get
    if (
        env("MLFLOW_TRACKING_AUTH")
        or env("MLFLOW_TRACKING_AWS_SIGV4", "").lower() in ("1", "true")
        or env("MLFLOW_WORKSPACE")
    ):
        from mlflow.exceptions import MlflowException
        from mlflow.utils.credentials import get_default_host_creds
        from mlflow.utils.rest_utils import http_request

        try:
            return http_request(
                get_default_host_creds(uri),
                MLFLOW_PROBE,
                "GET",
                max_retries=0,
                timeout=timeout_s,
                raise_on_status=False,
                params={"max_results": 1},
            )
        except MlflowException as exc:  # what requests raised, wrapped
            raise (exc.__cause__ or exc.__context__ or requests.RequestException(str(exc))) from None
    user, password = env("MLFLOW_TRACKING_USERNAME"), env("MLFLOW_TRACKING_PASSWORD")
    if not (user and password):
        stored = configparser.ConfigParser()
        stored.read(Path("~/.mlflow/credentials").expanduser())
        if "mlflow" in stored:
            user = user or stored["mlflow"].get("mlflow_tracking_username")
            password = password or stored["mlflow"].get("mlflow_tracking_password")
    headers = {"Authorization": f"Bearer {env('MLFLOW_TRACKING_TOKEN')}"} if env("MLFLOW_TRACKING_TOKEN") else {}
    insecure = env("MLFLOW_TRACKING_INSECURE_TLS", "").lower() in ("1", "true")
    return requests.get(
        uri.rstrip("/") + MLFLOW_PROBE,
        params={"max_results": 1},
        headers=headers,
        auth=(user, password) if user and password and not headers else None,
        verify=False if insecure else (env("MLFLOW_TRACKING_SERVER_CERT_PATH") or True),
        cert=env("MLFLOW_TRACKING_CLIENT_CERT_PATH") or None,
        timeout=timeout_s,
        allow_redirects=False,
    )


def _server_message(response) -> str:
    """An MLflow server's error message (its JSON's `message`), else the start of its body."""
    try:
        found = response.json()
    except ValueError:
        found = None
    text = found.get("message") if isinstance(found, dict) else None
    return " ".join(str(text or response.text[:300] or response.reason or "").split())
