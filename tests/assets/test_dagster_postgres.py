"""Dagster on PostgreSQL (issue 31): the shipped settings with instance/postgres-storage.yaml keep runs, the event
log and schedule storage in a real PostgreSQL server (tests/postgres.py, on loopback), with its password only in
DAGSTER_POSTGRES_URL. A real `dagster-webserver` and `dagster-daemon`, as a deployment runs them, materialize the
tiny pipeline through GraphQL; then the server restarts while a run trains."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests
import yaml

from dragon_dagster.cli import PROJECT_DAGSTER_YAML
from tests.assets.test_webserver import Webserver
from tests.support import on_a_command_line, user_project, wait_until, workers, write_pipeline

STORAGE_YAML = PROJECT_DAGSTER_YAML.with_name("postgres-storage.yaml")
# what `make ui DAGSTER_INSTANCE=postgres` writes into its Dagster home, and the deployment page tells people to
POSTGRES_INSTANCE = PROJECT_DAGSTER_YAML.read_text() + STORAGE_YAML.read_text()
# long enough that PostgreSQL can stop, restart and crash for OUTAGE_S while the worker trains: a warm-started worker
# takes about 0.05 s a step here on an idle machine (batches of 8 rows), so about 30 s in all
TRAIN_ARGS = (
    "{max_steps: 600, batch_size: 8, grad_accum: 1, logging_steps: 1, save_steps: 1000, max_seq_len: 64, "
    "learning_rate: 1.0e-3}"
)
DATASET = [["tiny", "tickets"], ["tiny", "sft_dataset"]]
OUTAGE_S = 15  # past dagster-postgres's retries (about 6 s) and the training step's status poll (every 2 s)
DAEMONS = "{ instance { daemonHealth { allDaemonStatuses { daemonType required healthy } } } }"
# one query on each storage's connection: the daemons' heartbeats (run storage) and an asset (the event log)
BOTH_STORAGES = """{ instance { daemonHealth { allDaemonStatuses { healthy } } }
  assetOrError(assetKey: {path: ["tiny", "tickets"]}) {
    ... on Asset { assetMaterializations(limit: 1) { runId } } } }"""
ASSET = """query Asset($path: [String!]!) { assetOrError(assetKey: {path: $path}) {
  ... on Asset { assetMaterializations(limit: 5) { runId } } } }"""
RUN_EVENTS = """query Events($runId: ID!) { logsForRun(runId: $runId, limit: 5000) {
  ... on EventConnection { events { __typename ... on MessageEvent { message }
    ... on ErrorEvent { error { message } } } } } }"""


def test_the_postgres_instance_is_the_shipped_one_with_its_records_on_postgres(tmp_path, monkeypatch):
    """Fast: the same settings as dagster.yaml but `storage`; the URL is read from the environment in each process,
    so the instance reference Dagster hands its run workers names the variable, never the password."""
    from dagster._core.instance.ref import InstanceRef
    from dagster._serdes import serialize_value

    assert yaml.safe_load(STORAGE_YAML.read_text()) == {
        "storage": {"postgres": {"postgres_url": {"env": "DAGSTER_POSTGRES_URL"}}}
    }
    assert "storage" not in yaml.safe_load(PROJECT_DAGSTER_YAML.read_text())  # appending it overrides nothing

    (tmp_path / "dagster.yaml").write_text(POSTGRES_INSTANCE)
    monkeypatch.setenv("DAGSTER_POSTGRES_URL", "postgresql://dagster:s3cret-Pa55@db.example:5432/dagster")
    ref = InstanceRef.from_dir(str(tmp_path))  # checks the file against Dagster's schema; connects to nothing
    assert ref.storage_data.module_name == "dagster_postgres"
    assert ref.storage_data.class_name == "DagsterPostgresStorage"
    assert "s3cret-Pa55" not in serialize_value(ref)
    assert "DAGSTER_POSTGRES_URL" in ref.storage_data.config_yaml


class Deployment:
    """`dagster-webserver` and `dagster-daemon run` as separate processes (as a deployment runs them, and unlike
    `dagster dev`), sharing nothing but the PostgreSQL database named by DAGSTER_POSTGRES_URL."""

    def __init__(self, root: Path, project: Path, url: str):
        self.root, self.url = root, url
        self.daemon = None
        self.server = Webserver(
            root,
            project,
            dagster_yaml=POSTGRES_INSTANCE,
            program=("dagster-webserver",),
            env={"DAGSTER_POSTGRES_URL": url},
        )
        self.daemon_log = open(root / "daemon.log", "a")
        try:
            self.daemon = subprocess.Popen(
                [str(Path(sys.executable).parent / "dagster-daemon"), "run", "-w", "workspace.yaml"],
                env=self.server.env,
                stdout=self.daemon_log,
                stderr=subprocess.STDOUT,
                cwd=project,
                start_new_session=True,
            )

            def daemons_up():
                statuses = self.server.gql(DAEMONS)["instance"]["daemonHealth"]["allDaemonStatuses"]
                return statuses and all(s["healthy"] for s in statuses if s["required"])

            wait_until(daemons_up, 120, "the daemon's heartbeats", alive=self.gone, every=1)
        except BaseException:
            self.stop()
            raise

    def gone(self) -> str | None:
        code = self.daemon.poll() if self.daemon else None
        if code is not None:
            return f"dagster-daemon exited with {code}:\n{(self.root / 'daemon.log').read_text()[-3000:]}"
        return self.server.gone()

    def wait(self, run_id: str, timeout: float) -> str:
        def ended() -> str | None:
            status = self.server.status(run_id)
            return status if status in ("SUCCESS", "FAILURE", "CANCELED") else None

        return wait_until(ended, timeout, f"run {run_id} to end", alive=self.gone, every=1)

    def settle(self, tries: int = 10) -> int:
        """After a restart of PostgreSQL: query the webserver until it answers (the connection it keeps open for
        each storage died with the server; a query that meets it fails once). How many failed first."""
        for failed in range(tries):
            try:
                self.server.gql(BOTH_STORAGES)
                return failed
            except (requests.RequestException, AssertionError) as exc:
                answer = exc.response.text if isinstance(exc, requests.HTTPError) else str(exc)
                print(f"webserver query failed after the restart: {answer[:300]}")
                time.sleep(1)
        pytest.fail(f"the webserver answers no query after PostgreSQL's restart:\n{self.logs()[-3000:]}")

    def logs(self) -> str:
        return "".join((self.root / name).read_text(errors="replace") for name in ("webserver.log", "daemon.log"))

    def stop(self) -> None:
        self.server.stop()
        if self.daemon and self.daemon.poll() is None:
            os.killpg(self.daemon.pid, signal.SIGTERM)
            try:
                self.daemon.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
        # and whatever outlived them in their groups: a code server the daemon was starting as it stopped
        for group in (self.server.proc.pid, self.daemon.pid if self.daemon else None):
            try:
                if group:
                    os.killpg(group, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.daemon_log.close()


@pytest.fixture(scope="module")
def deployment(postgres, tiny_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("pg-deployment")
    project = root / "project"
    write_pipeline(user_project(project), tiny_model, args=TRAIN_ARGS)
    name = f"dagster_{secrets.token_hex(4)}"
    postgres.create_database(name)
    started = time.monotonic()
    # psycopg2's driver named: SQLAlchemy 2.1 takes postgresql:// for psycopg 3, which dagster-postgres cannot use
    deployed = Deployment(root, project, postgres.url(name, driver="postgresql+psycopg2"))
    print(f"webserver and daemon up in {time.monotonic() - started:.0f} s")
    yield deployed
    deployed.stop()


def db(deployment) -> str:
    return urlsplit(deployment.url).path.lstrip("/")


def rows(postgres, deployment, statement: str) -> list[list[str]]:
    out = postgres.sql(statement, database=db(deployment))
    return [line.split("|") for line in out.splitlines()] if out else []


@pytest.fixture(scope="module")
def dataset_run(deployment) -> str:
    """The tiny pipeline's data assets materialized through the webserver and daemon (without their checks: two
    step processes fewer); the run's id. The training test builds on them."""
    started = time.monotonic()
    run_id = deployment.server.launch("tiny_pipeline", DATASET, {}, checks=[])
    assert deployment.wait(run_id, timeout=300) == "SUCCESS", deployment.logs()[-3000:]
    print(f"dataset run done in {time.monotonic() - started:.0f} s")
    return run_id


@pytest.mark.slow
def test_a_materialization_through_the_webserver_and_daemon_is_stored_in_postgres(deployment, dataset_run, postgres):
    from dagster import DagsterEventType

    server, run_id = deployment.server, dataset_run
    # in PostgreSQL's own tables: the run, its events, the assets' materializations, the daemons' heartbeats
    assert rows(postgres, deployment, f"SELECT status FROM runs WHERE run_id = '{run_id}'") == [["SUCCESS"]]
    types = {
        t for (t,) in rows(postgres, deployment, f"SELECT dagster_event_type FROM event_logs WHERE run_id = '{run_id}'")
    }
    expected = {DagsterEventType.RUN_START, DagsterEventType.STEP_SUCCESS, DagsterEventType.ASSET_MATERIALIZATION}
    assert {e.value for e in expected | {DagsterEventType.RUN_SUCCESS}} <= types, types
    materialized = rows(
        postgres,
        deployment,
        f"SELECT asset_key FROM event_logs WHERE run_id = '{run_id}' AND dagster_event_type = 'ASSET_MATERIALIZATION'",
    )
    assert sorted(k for (k,) in materialized) == ['["tiny", "sft_dataset"]', '["tiny", "tickets"]']
    latest = rows(postgres, deployment, "SELECT asset_key FROM asset_keys WHERE last_materialization IS NOT NULL")
    assert sorted(k for (k,) in latest) == ['["tiny", "sft_dataset"]', '["tiny", "tickets"]']
    assert rows(postgres, deployment, "SELECT count(*) FROM daemon_heartbeats") != [["0"]]
    # schedule storage: the pipeline's feedback sensor's ticks (it skips: no feedback yet)
    assert rows(postgres, deployment, "SELECT count(*) FROM job_ticks") != [["0"]]
    assert not (server.home / "history").exists(), "no SQLite run or event storage in DAGSTER_HOME"

    # and through the webserver, which reads them back from there
    [materialization] = server.gql(ASSET, path=["tiny", "sft_dataset"])["assetOrError"]["assetMaterializations"]
    assert materialization["runId"] == run_id

    assert_no_password(deployment, postgres)


def assert_no_password(deployment, postgres) -> None:
    """The password is nowhere but in the environment: not in the webserver's or the daemon's log (errors
    included), DAGSTER_HOME, the project or the runs directory, on no process's command line, in no row."""
    secret = postgres.password
    assert secret in deployment.url
    files = [p for p in deployment.root.rglob("*") if p.is_file() and not p.is_symlink()]
    assert not [str(p) for p in files if secret.encode() in p.read_bytes()]
    assert not on_a_command_line(secret)
    assert secret not in postgres.dump(db(deployment))


def events_of(postgres, deployment, run_id: str | None = None) -> list[list[str]]:
    where = f" WHERE run_id = '{run_id}'" if run_id else ""
    return rows(postgres, deployment, f"SELECT id, run_id, dagster_event_type FROM event_logs{where} ORDER BY id")


@pytest.mark.slow
def test_postgres_restarting_while_a_run_trains(deployment, dataset_run, postgres):
    """Two outages while one run trains: a quick restart (as `pg_ctl restart` does, within dagster-postgres's
    ~6 s of retries), after which the run goes on recording; then a crash (stop -m immediate) that lasts past
    the retries. Every event stored before either is still there after, and the run finishes: SUCCESS, its
    training kept."""
    server, runs = deployment.server, deployment.root / "runs"
    run_id = server.launch("tiny_pipeline", [["tiny", "sft_adapter"]], {}, checks=[])
    progress = f"artifacts/tiny/sft_adapter/.tmp-*.run-{run_id}.*/progress.jsonl"

    def steps() -> int:
        return max((len(f.read_text().splitlines()) for f in runs.glob(progress)), default=0)

    def training() -> bool:
        status = server.status(run_id)
        if status not in ("QUEUED", "NOT_STARTED", "STARTING", "STARTED"):
            pytest.fail(f"the run is {status} before training got going:\n{deployment.logs()[-3000:]}")
        return steps() >= 2

    wait_until(training, 300, "training to log two steps", alive=deployment.gone, every=0.5)
    [worker] = workers(str(runs / "artifacts" / "tiny" / "sft_adapter"))

    # 1. a quick restart: the run goes on, and its new events land in the restarted server
    before = events_of(postgres, deployment)
    postgres.restart(down_s=1)
    at_step = steps()
    deployment.settle()
    recorded = wait_until(
        lambda: [e for e in events_of(postgres, deployment, run_id) if int(e[0]) > int(before[-1][0])],
        60,
        "the run to record events after the restart",
        alive=deployment.gone,
    )
    after = events_of(postgres, deployment)
    assert not [e for e in before if e not in after], "events stored before the restart were lost"
    assert server.status(run_id) == "STARTED" and Path(f"/proc/{worker}").exists()
    print(f"quick restart at training step {at_step}: {len(recorded)} events recorded after it")

    # 2. a crash that outlasts dagster-postgres's retries while the step reports the training (a log event each
    # step) and asks for its run's status (every 2 s)
    before = events_of(postgres, deployment)
    runs_before = rows(postgres, deployment, "SELECT run_id FROM runs")
    postgres.stop(mode="immediate")
    at_step = steps()
    time.sleep(OUTAGE_S)
    postgres.start()
    worker_state = "still training" if Path(f"/proc/{worker}").exists() else "ended"
    print(f"crash at training step {at_step}, PostgreSQL down {OUTAGE_S} s; the worker then: {worker_state}")
    failed_queries = deployment.settle()

    status = deployment.wait(run_id, timeout=180)
    after = events_of(postgres, deployment)
    assert not [e for e in before if e not in after], "events stored before the crash were lost"
    assert sorted(rows(postgres, deployment, "SELECT run_id FROM runs")) == sorted(runs_before)
    events = server.gql(RUN_EVENTS, runId=run_id)["logsForRun"]["events"]
    print(f"run {status}; {failed_queries} webserver queries failed just after the restart; its last events:")
    print("\n".join(f"  {e['__typename']}: {e.get('message', '')} {e.get('error') or ''}"[:400] for e in events[-12:]))
    # the step's checks of its run's status cannot reach the database during the outage: that is "unknown", not a
    # reason to stop the training (launchers/base.py run_gone), so the run records its result once the server is
    # back. Before that, every crash failed the run, its finished training thrown away.
    assert status == "SUCCESS", "\n".join(str(e) for e in events[-12:])
    assert_no_password(deployment, postgres)
