"""engine/outages.py: a store that is down or refuses the login is one line (the store, the setting, the host, the
fix) within seconds. The driver's words are cut to their reason; an MLflow tracking server that hangs or is not an
MLflow server is told apart, against real sockets and a real HTTP server on loopback (the real PostgreSQL and
`mlflow server` cases are tests/test_store_outages.py's)."""

from __future__ import annotations

import pickle
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from dragon_dagster.engine.outages import CONNECT_TIMEOUT_S, StoreUnavailable, check_tracking_server, short_reason

REFUSED = (
    '(psycopg2.OperationalError) connection to server at "127.0.0.1", port 5 failed: Connection refused\n'
    "\tIs the server running on that host and accepting TCP/IP connections?\n\n"
    "(Background on this error at: https://sqlalche.me/e/21/e3q8)"
)


def test_a_drivers_message_is_cut_to_its_reason_and_the_reason_names_the_fix():
    cases = {  # what libpq, psycopg and SQLAlchemy say -> the reason kept, and a word of the fix
        REFUSED: ("Connection refused", "start PostgreSQL on db:5"),
        'connection failed: connection to server at "db" (10.0.0.2), port 5 failed: FATAL:  password authentication '
        'failed for user "dragon"': (
            'password authentication failed for user "dragon"',
            "correct the user or password",
        ),
        'connection to server at "db", port 5 failed: FATAL: database "dagster" does not exist': (
            'database "dagster" does not exist',
            "create the database on db:5",
        ),
        'connection to server at "db", port 5 failed: timeout expired': ("timeout expired", "reachable from this"),
        'could not translate host name "db" to address: Name or service not known': (
            'could not translate host name "db" to address: Name or service not known',
            "correct the host name",
        ),
    }
    for detail, (reason, fix) in cases.items():
        error = StoreUnavailable.of(
            "Dagster's instance storage", "$DAGSTER_POSTGRES_URL", "postgresql://u:pw@db:5/d", detail
        )
        assert error.reason == reason and fix in error.fix, (detail, error)
        assert "\n" not in str(error) and "pw" not in str(error) and "u:***@db:5" in str(error)
    both = "".join(  # libpq tries each address of a name
        f'connection to server at "localhost" ({address}), port 5 failed: Connection refused\n\tIs the server '
        "running on that host and accepting TCP/IP connections?\n"
        for address in ("::1", "127.0.0.1")
    )
    assert short_reason(both) == "Connection refused", "each address libpq tried, said once"


def test_the_error_is_its_parts_and_travels_as_they_are():
    error = StoreUnavailable.of("the feedback store", "$DRAGON_FEEDBACK_URL", "postgresql://u:s3cret@db:5/f", REFUSED)
    assert str(error) == (
        "the feedback store on db:5 ($DRAGON_FEEDBACK_URL: postgresql://u:***@db:5/f): Connection refused. "
        "Fix: start PostgreSQL on db:5, or correct the host and port in $DRAGON_FEEDBACK_URL."
    )
    copy = pickle.loads(pickle.dumps(error))  # a worker process's error, sent back
    assert str(copy) == str(error) and "s3cret" not in pickle.dumps(error).decode("latin-1")


def test_a_tracking_server_that_hangs_is_one_line_within_its_timeout():
    """A host that takes the connection and never answers: MLflow's client would wait 120 s a request and retry
    seven times; the check waits CONNECT_TIMEOUT_S once."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        began = time.monotonic()
        with pytest.raises(StoreUnavailable) as caught:
            check_tracking_server(f"http://127.0.0.1:{port}", "$MLFLOW_TRACKING_URI")
        took = time.monotonic() - began
    assert CONNECT_TIMEOUT_S <= took < 10, took
    assert str(caught.value) == (
        f"MLflow's tracking server on 127.0.0.1:{port} ($MLFLOW_TRACKING_URI: http://127.0.0.1:{port}): connected, "
        f"but no answer within {CONNECT_TIMEOUT_S} s. Fix: check that 127.0.0.1:{port} is up and reachable from this "
        "machine (a firewall?), or correct $MLFLOW_TRACKING_URI."
    )


class NotMLflow(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(404)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_a_server_that_is_not_mlflow_is_named_so():
    """The Dagster UI's port given as MLflow's, say: /health-style checks pass on any web server."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), NotMLflow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        uri = f"http://127.0.0.1:{server.server_address[1]}"
        with pytest.raises(StoreUnavailable, match=r"no MLflow API there \(HTTP 404 on /api/2.0/mlflow/experiments"):
            check_tracking_server(uri, "MLflowTracking.tracking_uri")
    finally:
        server.shutdown()
        server.server_close()
