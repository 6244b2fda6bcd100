"""Every store outage or bad credential is one line naming the store, the setting, the host and the fix, within
10 s (issue 59): Dagster's instance storage, MLflow's tracking store (a database; a server, and the database behind
it) and the feedback store, for the `dragon` command (a real process, timed from its start: imports count), the
chat server and the chat page; `--debug` still shows the traceback. Against a real PostgreSQL (the session's
throwaway cluster, stopped for real) and, in the slow test, a real `mlflow server` whose database is stopped under
it while it stays up.

Before: `dragon status` with PostgreSQL stopped exited after 15 s with six retry warnings and a 199-line traceback;
`dragon models` with MLflow's database stopped said nothing for 250 s, then `too many 503 error responses`; a chat
turn waited 249 s for its trace and a rating 247 s for its assessment."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dragon_dagster.cli import PROJECT_DAGSTER_YAML
from tests.support import closed_port

DRAGON = Path(sys.executable).with_name("dragon")
POSTGRES_INSTANCE = (
    PROJECT_DAGSTER_YAML.read_text() + PROJECT_DAGSTER_YAML.with_name("postgres-storage.yaml").read_text()
)
WITHIN_S = 10
# what the machine running the tests may have set, which would change which store a command reaches
STORE_VARIABLES = ("MLFLOW_TRACKING_URI", "DRAGON_FEEDBACK_URL", "DAGSTER_POSTGRES_URL", "DRAGON_DEBUG")


def dragon(*args: str, env: dict, debug: bool = False) -> tuple[subprocess.CompletedProcess, float]:
    """The `dragon` command as people run it, and how long it took from its start."""
    began = time.monotonic()
    done = subprocess.run(
        [str(DRAGON), *(["--debug"] if debug else []), *args],
        env={**{k: v for k, v in os.environ.items() if k not in STORE_VARIABLES}, **env},
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=300,
    )
    return done, time.monotonic() - began


def one_line(done: subprocess.CompletedProcess, took: float, *named: str, secret: str = "") -> str:
    """The command failed in time with one line on stderr naming each of `named` and a fix; that line."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1 and lines[0].startswith("Error: "), done.stderr[-3000:]
    assert "Traceback" not in done.stdout + done.stderr and "Fix: " in lines[0], lines[0]
    for name in named:
        assert name in lines[0], (name, lines[0])
    assert not secret or secret not in done.stdout + done.stderr
    assert took < WITHIN_S, f"{took:.1f} s: {lines[0]}"
    return lines[0]


@pytest.fixture()
def dagster_home(tmp_path) -> Path:
    """A Dagster home with the shipped instance settings and the PostgreSQL storage block, as the deployment guide
    and `make ui DAGSTER_INSTANCE=postgres` write it."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(POSTGRES_INSTANCE)
    return home


def test_dagster_storage_down_refused_or_unset_is_one_line_within_10_s(postgres, dagster_home, tmp_path):
    """`dragon status` reaches Dagster's storage before it loads anything: a closed port, a wrong password, a host
    that takes the connection and never answers, an unset variable, and a user that may not create Dagster's
    tables (on PostgreSQL 15, one that does not own the database) are each one line; --debug shows the
    traceback."""
    database = postgres.create_database().rsplit("/", 1)[1]
    base = {"DAGSTER_HOME": str(dagster_home), "DRAGON_RUNS_DIR": str(tmp_path / "runs")}
    setting = "$DAGSTER_POSTGRES_URL"

    def status(url: str | None, debug: bool = False):
        return dragon("status", "support", env={**base, **({"DAGSTER_POSTGRES_URL": url} if url else {})}, debug=debug)

    port = closed_port()
    refused = f"postgresql+psycopg2://dragon:pw-5150@127.0.0.1:{port}/dagster"
    line = one_line(*status(refused), "Dagster's instance storage", setting, f"127.0.0.1:{port}", secret="pw-5150")
    assert line.endswith(
        f"Connection refused. Fix: start PostgreSQL on 127.0.0.1:{port}, or correct the host and port in {setting}."
    )
    done, _ = status(refused, debug=True)
    assert done.returncode == 1 and "Traceback (most recent call last)" in done.stderr
    assert "DagsterStorageError: Dagster's instance storage" in done.stderr

    wrong = postgres.url(database, password="not-it-7", driver="postgresql+psycopg2")
    line = one_line(*status(wrong), setting, f"127.0.0.1:{postgres.port}", secret="not-it-7")
    assert 'password authentication failed for user "dragon". Fix: correct the user or password in' in line

    with socket.socket() as silent:  # accepts, never speaks: libpq would wait as long as the kernel lets it
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        hung = f"postgresql+psycopg2://dragon:pw-hung-1@127.0.0.1:{silent.getsockname()[1]}/dagster"
        assert "timeout expired. Fix: check that 127.0.0.1:" in one_line(*status(hung), setting)

    line = one_line(*status(None), setting)
    assert "$DAGSTER_POSTGRES_URL is not set" in line and "Fix: set DAGSTER_POSTGRES_URL=postgresql+psycopg2://" in line

    postgres.sql("CREATE ROLE viewer LOGIN PASSWORD 'viewer-pw'")
    viewer = postgres.url(database, driver="postgresql+psycopg2").replace(
        f"dragon:{postgres.password}@", "viewer:viewer-pw@"
    )
    line = one_line(*status(viewer), setting, secret="viewer-pw")
    assert f"user viewer may not create tables in schema public of database {database}" in line
    assert "Fix: make the user in $DAGSTER_POSTGRES_URL the owner of its database" in line


def test_a_feedback_user_that_may_not_create_its_schema_is_one_line(postgres, tmp_path):
    """On PostgreSQL 15 a user that does not own its database may not create the store's schema: that was a
    traceback ending `permission denied for database`."""
    url = postgres.create_database()
    postgres.sql("CREATE ROLE rater LOGIN PASSWORD 'rater-pw'")
    rater = url.replace(f"dragon:{postgres.password}@", "rater:rater-pw@")
    env = {"DRAGON_RUNS_DIR": str(tmp_path / "runs"), "DRAGON_FEEDBACK_URL": rater}
    done, took = dragon("chat", "tiny", "--model", "http://127.0.0.1:9/v1", env=env)
    line = one_line(done, took, "the feedback store", "$DRAGON_FEEDBACK_URL", secret="rater-pw")
    assert f"permission denied for database {url.rsplit('/', 1)[1]}. Fix: make the user in $DRAGON_FEEDBACK_URL" in line


def test_with_postgresql_stopped_each_store_is_one_line_within_10_s(postgres, dagster_home, tmp_path):
    """One server with the three databases, as the deployment guide has it, stopped for real: Dagster's storage
    (`dragon status`), MLflow's database as the tracking URI (`dragon models`), and the feedback store (`dragon chat`,
    and the chat server, `dragon chat-ui`, which stops before it serves) each say so in one line."""
    urls = {name: postgres.create_database() for name in ("dagster", "mlflow", "feedback")}
    env = {
        "DAGSTER_HOME": str(dagster_home),
        "DRAGON_RUNS_DIR": str(tmp_path / "runs"),
        "DAGSTER_POSTGRES_URL": urls["dagster"].replace("postgresql://", "postgresql+psycopg2://"),
        "MLFLOW_TRACKING_URI": urls["mlflow"],
        "DRAGON_FEEDBACK_URL": urls["feedback"],
    }
    host, secret = f"127.0.0.1:{postgres.port}", postgres.password
    postgres.stop()
    try:
        one_line(
            *dragon("status", "support", env=env),
            "Dagster's instance storage",
            "$DAGSTER_POSTGRES_URL",
            host,
            secret=secret,
        )
        one_line(*dragon("models", "tiny", env=env), "MLflow's database", "$MLFLOW_TRACKING_URI", host, secret=secret)
        for command in ("chat", "chat-ui"):
            done, took = dragon(command, "tiny", "--model", "http://127.0.0.1:9/v1", env=env)
            line = one_line(done, took, "the feedback store", "$DRAGON_FEEDBACK_URL", host, secret=secret)
            assert line.endswith(
                f"Fix: start PostgreSQL on {host}, or correct the host and port in $DRAGON_FEEDBACK_URL."
            )
    finally:
        postgres.start()


def test_the_storage_urls_read_are_the_ones_dagster_postgres_builds(tmp_path, monkeypatch):
    """cli/dagster_storage.py reads dagster.yaml without importing dagster (seconds a down database's message must
    not wait for): its URLs are the ones dagster-postgres connects to, in both of the storage's forms."""
    import yaml
    from dagster._config import process_config
    from dagster_postgres import DagsterPostgresStorage
    from dagster_postgres.utils import pg_url_from_config

    from dragon_dagster.cli.dagster_storage import postgres_storage

    monkeypatch.setenv("PG_PASSWORD", "p@ss:w/rd%")
    forms = {
        "postgres_url": {"postgres_url": {"env": "PG_URL"}},
        "postgres_db": {
            "postgres_db": {
                "username": "dagster",
                "password": {"env": "PG_PASSWORD"},
                "hostname": "db.internal",
                "db_name": "dagster",
                "port": 6543,
                "params": {"sslmode": "require"},
            }
        },
    }
    monkeypatch.setenv("PG_URL", "postgresql+psycopg2://dagster:s3cret@db.internal:5432/dagster")
    for form, config in forms.items():
        (tmp_path / "dagster.yaml").write_text(yaml.safe_dump({"storage": {"postgres": config}}))
        expected = pg_url_from_config(process_config(DagsterPostgresStorage.config_type(), config).value)
        setting = "$PG_URL" if form == "postgres_url" else f"postgres_db in {tmp_path / 'dagster.yaml'}"
        assert postgres_storage(tmp_path) == [(expected, setting)], form
    separate = {
        key: {"module": f"dagster_postgres.{key}", "class": "X", "config": forms["postgres_url"]}
        for key in ("run_storage", "event_log_storage", "schedule_storage")
    }
    (tmp_path / "dagster.yaml").write_text(yaml.safe_dump(separate))
    assert [setting for _, setting in postgres_storage(tmp_path)] == ["$PG_URL"], "one database, reached once"
    (tmp_path / "dagster.yaml").write_text(PROJECT_DAGSTER_YAML.read_text())  # the shipped default: SQLite files
    assert postgres_storage(tmp_path) == []


def test_a_rating_while_the_feedback_store_is_down_is_kept_and_stored_once_after(postgres, tmp_path):
    """The chat's store (as chat_target makes it: a short ride-out) with PostgreSQL stopped: a rating is kept with
    the store's one line within 10 s, and the ones after it queue behind it; once the server is back, the next
    rating stores them first, in order. A kept record's key finds a write that committed before its
    acknowledgement was lost, so it is never stored twice."""
    from dragon_dagster.chat_target import feedback_store
    from dragon_dagster.engine.infer.chat import Chat
    from dragon_dagster.resources.storage import ArtifactStore
    from tests.test_chat_ui import Echo

    store = feedback_store("tiny", ArtifactStore(feedback_url=postgres.create_database(), runs_dir=str(tmp_path)))
    chat = Chat(Echo(), store=store)
    for text in ("one", "two", "three", "four"):
        chat.say(text)
    assert chat.rate(True, index=0) == 1
    postgres.stop()
    try:
        began = time.monotonic()
        assert chat.rate(False, index=1) is None
        took = time.monotonic() - began
        kept = chat.feedback[-1]["store_error"]
        assert kept.startswith(f"the feedback store (schema feedback_tiny) on 127.0.0.1:{postgres.port} (")
        assert "Fix: start PostgreSQL" in kept and kept.endswith("stored with its next rating or edit.")
        assert took < WITHIN_S, took
        assert chat.edit("Better two.", index=2) is None and len(chat.kept) == 2
    finally:
        postgres.start()
    assert chat.rate(True, index=3) == 4 and not chat.kept
    assert [(r["id"], r["reply"], r["verdict"]) for r in store.records()] == [
        (1, "Reply 1 to: one", "up"),
        (2, "Reply 2 to: two", "down"),
        (3, "Reply 3 to: three", "edit"),
        (4, "Reply 4 to: four", "up"),
    ]
    again = chat.feedback[1]
    turns, reply = again["turns"], again["reply"]
    assert store.record(chat.conversation_id, turns, reply, "down", key=again["key"]) == 2, "found, not added"
    assert store.count() == 4
    print(f"a rating during the outage was kept in {took:.1f} s")


def test_with_mlflow_gone_a_turn_goes_untraced_and_an_assessment_waits_saying_why_at_once():
    """The tracer asks the tracking store before each trace and assessment: without that, MLflow's client
    retried a server whose database was down for 249 s a turn (and the trace was lost anyway) and 247 s a
    rating. A server that is gone here (a closed port) is the quickest such outage; the slow test below stops
    the database behind a real server."""
    from dragon_dagster.engine.infer.chat import Chat
    from dragon_dagster.engine.infer.tracing import ChatTracer, TracingError
    from tests.test_chat_ui import Echo

    port = closed_port()
    tracer = ChatTracer(f"http://127.0.0.1:{port}", "0", setting="$MLFLOW_TRACKING_URI")
    chat = Chat(Echo(), tracer=tracer)
    began = time.monotonic()
    assert chat.say("hi") == "Reply 1 to: hi" and "trace_id" not in chat.messages[-1]
    assert chat.trace_error == (
        f"no MLflow trace for this turn: MLflow's tracking server on 127.0.0.1:{port} ($MLFLOW_TRACKING_URI: "
        f"http://127.0.0.1:{port}): Connection refused. Fix: start the MLflow tracking server on 127.0.0.1:{port}, "
        "or correct the host and port in $MLFLOW_TRACKING_URI."
    )
    with pytest.raises(TracingError, match=r"is kept and retried with the next rating: MLflow's tracking server on"):
        tracer.assess("tr-" + "0" * 32, "up", None, 1)
    assert len(tracer.pending) == 1 and tracer.retry_pending() == 1
    assert time.monotonic() - began < WITHIN_S


@pytest.mark.slow  # a real `mlflow server` on a new PostgreSQL database: about a minute to start on 2 cores
def test_mlflow_up_its_database_down_and_the_chat_page_keeps_its_ratings(
    postgres, start_mlflow_server, tiny_model, tmp_path
):
    """MLflow's server stays up (its /health answers) while its database is down. `dragon models` says so in one
    line naming the database's host; a run started meanwhile fails at its first step with that line as the reason;
    the chat page answers on, each turn untraced with that line, and a rating is kept with the feedback store's
    line, within 10 s each; when the database is back, the next rating stores the kept one first, in order, and
    the assessments follow."""
    from dagster import AssetSelection, DagsterInstance, materialize
    from mlflow import MlflowClient

    from dragon_dagster import chat_ui
    from dragon_dagster.assets.factory import build_pipeline_defs
    from dragon_dagster.chat_target import ChatModel, feedback_store, tracer
    from dragon_dagster.engine.pipeline import load
    from dragon_dagster.resources import TrainingResource, tracking
    from dragon_dagster.resources.storage import ArtifactStore
    from dragon_dagster.resources.tracking import MLflowTracking
    from tests.support import MLFLOW_WITHOUT_JOBS, healthy, write_pipeline
    from tests.test_chat_ui import Echo, drain

    server = start_mlflow_server(postgres.create_database(), str(tmp_path / "artifacts"), MLFLOW_WITHOUT_JOBS)
    # the server's first search is its slowest (lazy imports, first queries): more than the 5 s the chat's check
    # allows on a loaded 2-core machine, which would leave the first turn untraced for a server that is merely cold
    MlflowClient(server).search_experiments()
    store = feedback_store("tiny", ArtifactStore(feedback_url=postgres.create_database(), runs_dir=str(tmp_path)))
    traced = tracer("tiny", ChatModel({}, "echo", "echo"), "ana", None, tracking=MLflowTracking(tracking_uri=server))
    page = chat_ui.ChatHandlers(Echo(), store, "echo", stream_delay=0, tracer=traced)
    chat = drain(page.send("one", None, "", None, 0.7, 64))[2]
    first = chat.messages[1].get("trace_id")
    assert first, chat.trace_error
    assert first and "Recorded thumbs up on reply 1 (feedback #1" in page.like(chat, like(1, True))[2]

    host = f"127.0.0.1:{postgres.port}"
    postgres.stop()
    down = time.monotonic()
    try:
        assert healthy(f"{server}/health"), "the server itself is up"
        env = {"MLFLOW_TRACKING_URI": server, "DRAGON_RUNS_DIR": str(tmp_path / "runs")}
        line = one_line(*dragon("models", "tiny", env=env), "$MLFLOW_TRACKING_URI", host)
        assert f"MLflow's database behind the tracking server {server.split('//')[1]} on {host}" in line
        assert "the server answers 503: Connection refused. Fix: start the MLflow server's database on" in line
        done, _ = dragon("models", "tiny", env=env, debug=True)
        assert "Traceback (most recent call last)" in done.stderr and "StoreUnavailable" in done.stderr

        # a run: Dagster starts each in a process of its own, which checks the store afresh (this process has)
        tracking._CHECKED.discard(server)
        runs = tmp_path / "runs"
        began = time.monotonic()
        result = materialize(
            build_pipeline_defs(load(write_pipeline(tmp_path / "defs", tiny_model)))["assets"],
            resources={
                "store": ArtifactStore(runs_dir=str(runs)),
                "tracking": MLflowTracking(tracking_uri=server, runs_dir=str(runs)),
                "training": TrainingResource(device="cpu"),
            },
            instance=DagsterInstance.ephemeral(),
            selection=AssetSelection.assets(*[["tiny", n] for n in ("tickets", "sft_dataset", "sft_adapter")]),
            raise_on_error=False,
        )
        run_failed_s = time.monotonic() - began
        [failure] = result.get_step_failure_events()
        reason = failure.step_failure_data.error.cause
        assert failure.step_key == "tiny__sft_dataset" and reason.cls_name == "TrackingStoreError"
        assert f"MLflow's database behind the tracking server {server.split('//')[1]} on {host}" in reason.message
        assert run_failed_s < 60, run_failed_s  # the run's own start (definitions, the dataset step) included

        began = time.monotonic()
        _, _, chat, status = drain(page.send("two", chat, "", None, 0.7, 64))
        assert time.monotonic() - began < WITHIN_S and "trace_id" not in chat.messages[3]
        assert "**Not traced:** no MLflow trace for this turn: MLflow's database behind the" in status, status
        assert host in status

        began = time.monotonic()
        _, chat, status = page.like(chat, like(3, True))
        assert time.monotonic() - began < WITHIN_S
        assert status.startswith("**Kept thumbs up on reply 2, not stored yet:** the feedback store"), status
        assert host in status and "Fix: start PostgreSQL" in status and postgres.password not in status
    finally:
        postgres.start()
    outage = time.monotonic() - down

    began = time.monotonic()
    _, chat, status = page.like(chat, like(1, False))  # the next rating: the kept one is stored first
    assert "Recorded thumbs down on reply 1, replacing thumbs up (feedback #3" in status and not chat.kept
    stored = [(r["id"], r["reply"], r["verdict"]) for r in store.records()]
    assert stored == [(1, "Reply 1 to: one", "up"), (2, "Reply 2 to: two", "up"), (3, "Reply 1 to: one", "down")]
    from mlflow import MlflowClient

    thumbs = [a.value for a in MlflowClient(server).get_trace(first).info.assessments if a.name == "thumbs"]
    assert sorted(thumbs) == [False, True] and not traced.pending
    print(
        f"outage {outage:.1f} s; the run failed in {run_failed_s:.1f} s; the kept rating was stored "
        f"{time.monotonic() - began:.1f} s into the next rating"
    )


def like(index: int, liked: bool):
    import gradio as gr

    return gr.LikeData(None, {"index": index, "value": ["x"], "liked": liked})
