"""docs/operations/deployment.md, walked as a new operator would (issue 59): its SQL, its env file and its commands
are read out of the page, so the page cannot drift from what passes. The SQL runs on a throwaway PostgreSQL as the
superuser; then each store works as its own role, none of them a superuser: Dagster's instance (dagster.yaml from
`dragon dagster-yaml --postgres`) creates its tables and records a run, a real `mlflow server` keeps a run, a
metric and a registered model version, and the feedback store records a rating. Also (fast): what `make ui` and
`dragon mlflow-ui` serve for each kind of tracking URI."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from dragon_dagster.cli.deploy import POSTGRES_STORAGE_YAML, mlflow_ui_plan
from dragon_dagster.resources.storage import FEEDBACK_URL_ENV, ArtifactStore
from dragon_dagster.resources.tracking import MLflowTracking
from tests.support import free_port

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "operations" / "deployment.md"
BIN = Path(sys.executable).parent
ROLES = ("dagster", "mlflow", "feedback")
ENV_FILE = "/etc/dragon/dragon.env"
# the stores' variables, each named by the code that reads it: the guide's env file must set every one
STORE_VARIABLES = {
    "DAGSTER_HOME",  # Dagster's own
    yaml.safe_load(POSTGRES_STORAGE_YAML.read_text())["storage"]["postgres"]["postgres_url"]["env"],
    "DRAGON_RUNS_DIR",  # resources/storage.py's default_runs_dir
    FEEDBACK_URL_ENV,
    "MLFLOW_TRACKING_URI",  # MLflowTracking.uri
    "MLFLOW_BACKEND_STORE_URI",  # mlflow server's --backend-store-uri
    "MLFLOW_ARTIFACTS_DESTINATION",  # mlflow server's --artifacts-destination
}


def fenced_blocks(text: str) -> list[str]:
    """The bodies of the page's fenced code blocks, in order."""
    return re.findall(r"^```[\w-]*\n(.*?)^```$", text, flags=re.M | re.S)


def the_block(text: str, starting: str) -> str:
    """The one fenced block whose first line starts with `starting` (how the page names its files)."""
    found = [b for b in fenced_blocks(text) if b.startswith(starting)]
    assert len(found) == 1, f"{GUIDE.name}: {len(found)} code blocks start with {starting!r}"
    return found[0]


def the_block_with(text: str, line: str) -> str:
    """The one fenced block that has `line` as one of its lines."""
    found = [b for b in fenced_blocks(text) if line in b.splitlines()]
    assert len(found) == 1, f"{GUIDE.name}: {len(found)} code blocks have the line {line!r}"
    return found[0]


def bash(script: str, env: dict[str, str], cwd: Path) -> str:
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script], env=env, cwd=cwd, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"{script}\nfailed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def without(names: set[str]) -> dict[str, str]:
    """This process's environment without names, the venv's executables first on PATH (the environment the page
    says to install into)."""
    env = {k: v for k, v in os.environ.items() if k not in names}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


@pytest.fixture()
def roles_dropped_after(postgres):
    """The session's server as found after the test: the guide's databases and roles dropped."""
    yield
    for role in ROLES:
        postgres.sql(f"DROP DATABASE IF EXISTS {role} WITH (FORCE)")
    for role in ROLES:
        postgres.sql(f"DROP ROLE IF EXISTS {role}")


@pytest.mark.slow
def test_a_new_operator_s_run_of_the_guide_on_a_throwaway_postgres(
    postgres, roles_dropped_after, start_mlflow_server, tmp_path, monkeypatch
):
    import psycopg

    guide = GUIDE.read_text()
    started = time.monotonic()

    def took(step: str) -> None:
        print(f"{step}: {time.monotonic() - started:.1f} s in")

    passwords = {role: secrets.token_hex(24) for role in ROLES}  # as the page says: openssl rand -hex 24
    where = f"127.0.0.1:{postgres.port}"

    # 1. the databases: the SQL as written, its \prompt lines answered in their order
    sql = the_block(guide, "-- dragon-roles.sql:")
    assert "sudo -u postgres psql -v ON_ERROR_STOP=1 -f dragon-roles.sql" in sql.splitlines()[0]
    asked = re.findall(r"^\\prompt '[^']*' (\w+)_password$", sql, flags=re.M)
    assert sorted(asked) == sorted(ROLES), asked
    postgres.script(sql, stdin="".join(f"{passwords[role]}\n" for role in asked))
    for role in ROLES:
        assert postgres.sql(f"SELECT rolsuper, rolcreatedb, rolcreaterole FROM pg_roles WHERE rolname = '{role}'") == (
            "f|f|f"
        ), f"{role} is no superuser and makes no databases or roles"
        assert postgres.sql(f"SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = '{role}'") == role

    took("1. the databases")

    # 2. the env file, with this test's server, passwords and folders in place of the page's
    mlflow_port = free_port()
    srv = tmp_path / "srv"
    text = the_block(guide, f"# {ENV_FILE}:")
    for role in ROLES:
        assert f"{role}:<password>@db.internal:5432/{role}" in text, f"the {role} role's URL"
        text = text.replace(f"{role}:<password>@", f"{role}:{passwords[role]}@")
    text = (
        text.replace("db.internal:5432", where)
        .replace("/srv/dragon", str(srv))
        .replace("http://mlflow.internal:5000", f"http://127.0.0.1:{mlflow_port}")
        .replace("<a password for the chat page>", secrets.token_hex(8))
    )
    assert "<" not in re.sub(r"^#.*$", "", text, flags=re.M), f"a placeholder the test does not fill:\n{text}"
    for s3 in ("MLFLOW_ARTIFACTS_DESTINATION=s3://", "AWS_ACCESS_KEY_ID=", "AWS_SECRET_ACCESS_KEY=", "MLFLOW_S3_"):
        assert f"\n# {s3}" in text, f"the S3 artifact store's line {s3}"
    env_file = tmp_path / "dragon.env"
    env_file.write_text(text)
    names = set(re.findall(r"^([A-Z][A-Z0-9_]*)=", text, flags=re.M))
    assert STORE_VARIABLES <= names, f"the env file does not name {sorted(STORE_VARIABLES - names)}"
    # loaded as the page says a shell loads it; systemd's EnvironmentFile= reads the same KEY=value lines
    loaded = dict(
        line.split("=", 1)
        for line in bash(f"set -a; . {env_file}; set +a; env -0", without(names), tmp_path).split("\0")
        if line
    )
    settings = {name: loaded[name] for name in names}
    assert all(settings.values()), settings.keys()

    took("2. the env file")

    # 3. Dagster's instance: the page's commands, which load the env file themselves, from another directory
    dagster_steps = the_block_with(guide, 'dragon dagster-yaml --postgres > "$DAGSTER_HOME/dagster.yaml"')
    assert f"set -a; . {ENV_FILE}; set +a" in dagster_steps.splitlines()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    bash(dagster_steps.replace(ENV_FILE, str(env_file)), without(names), elsewhere)
    home = Path(settings["DAGSTER_HOME"])
    assert (home / "dagster.yaml").read_text().endswith(POSTGRES_STORAGE_YAML.read_text())
    assert passwords["dagster"] not in (home / "dagster.yaml").read_text()
    owner = "SELECT tableowner FROM pg_tables WHERE schemaname = 'public' AND tablename = '{}'"
    assert postgres.sql(owner.format("runs"), "dagster") == "dagster", "Dagster made its tables as its role"

    took("3. Dagster's instance set up")
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(elsewhere)
    from dagster import DagsterInstance, asset, materialize

    @asset
    def guide_check() -> int:
        return 1

    with DagsterInstance.get() as instance:
        assert instance.event_log_storage.get_concurrency_info("training").slot_count == 1
        result = materialize([guide_check], instance=instance)
    assert result.success
    assert postgres.sql(f"SELECT status FROM runs WHERE run_id = '{result.run_id}'", "dagster") == "SUCCESS"

    took("3. a run recorded in it")

    # 4. MLflow's server, reading its database and artifact store from the env file
    server_line = the_block_with(guide, "mlflow server --host 0.0.0.0 --port 5000 --allowed-hosts mlflow.internal:5000")
    assert f"set -a; . {ENV_FILE}; set +a" in server_line.splitlines()
    url = start_mlflow_server(settings["MLFLOW_BACKEND_STORE_URI"], None, env=settings, port=mlflow_port)
    assert url == settings["MLFLOW_TRACKING_URI"]
    took("4. MLflow's server up")
    tracking = MLflowTracking()  # from the environment, as every client of the page's
    run_id = tracking.start_run("guide", "a deployment's first run", {"stage": "guide"}, {"lr": 0.1})
    tracking.log_metrics(run_id, {"loss": 0.5}, step=0)
    client = tracking.client()
    client.log_text(run_id, "weights", "model/weights.txt")
    tracking.end_run(run_id)
    client.create_registered_model("guide")
    version = client.create_model_version("guide", f"{client.get_run(run_id).info.artifact_uri}/model", run_id)
    assert postgres.sql(owner.format("runs"), "mlflow") == "mlflow", "MLflow made its tables as its role"
    assert postgres.sql(f"SELECT status FROM runs WHERE run_uuid = '{run_id}'", "mlflow") == "FINISHED"
    assert postgres.sql(f"SELECT value FROM metrics WHERE run_uuid = '{run_id}' AND key = 'loss'", "mlflow") == "0.5"
    assert postgres.sql("SELECT version FROM model_versions WHERE name = 'guide'", "mlflow") == version.version
    [weights] = Path(settings["MLFLOW_ARTIFACTS_DESTINATION"]).rglob("weights.txt")
    assert weights.read_text() == "weights" and run_id in weights.parts
    # the links and `make ui`'s MLflow UI are that server, not a local store
    assert tracking.ui == url
    shown = subprocess.run(  # what `make ui` serves for MLflow: nothing, the server is the UI
        [str(BIN / "dragon"), "mlflow-ui", "--dry-run"], capture_output=True, text=True, timeout=60, check=True
    )
    assert shown.stdout.startswith(f"MLflow UI: {url}/#/experiments?") and "nothing to start" in shown.stdout
    took("4. MLflow's records and the UI's address")

    # 5. the feedback store: its schema made with the first rating, as its role
    store = ArtifactStore()  # from the environment too
    turns = [{"role": "user", "content": "Where is my order?"}]
    assert store.feedback_store("guide").record("c1", turns, "It shipped.", "up") == 1
    assert postgres.sql("SELECT nspowner::regrole FROM pg_namespace WHERE nspname = 'feedback_guide'", "feedback") == (
        "feedback"
    )
    assert postgres.sql("SELECT count(*) FROM feedback_guide.feedback", "feedback") == "1"

    # each role reaches its own database only
    for role in ROLES:
        for other in set(ROLES) - {role}:
            with pytest.raises(psycopg.OperationalError, match="permission denied for database"):
                psycopg.connect(f"postgresql://{role}:{passwords[role]}@{where}/{other}", connect_timeout=5).close()
    # why each database is its role's own (PostgreSQL 15+): a role let into a database it does not own can neither
    # make tables in its public schema (Dagster, MLflow) nor schemas (the feedback store), the page's two errors
    postgres.sql("GRANT CONNECT ON DATABASE dagster TO feedback")
    with psycopg.connect(f"postgresql://feedback:{passwords['feedback']}@{where}/dagster", autocommit=True) as guest:
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied for schema public"):
            guest.execute("CREATE TABLE t (x int)")
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied for database dagster"):
            guest.execute("CREATE SCHEMA s")
    postgres.sql("REVOKE CONNECT ON DATABASE dagster FROM feedback")
    took("5. the feedback store, the roles' reach")
    # and nothing fell back to a local store
    local = [p for folder in (home, srv) for p in folder.rglob("*") if p.suffix in (".db", ".sqlite", ".sqlite3")]
    assert not local, local


# ------------------------------------------------------------------------------------------ make ui (fast)


def test_mlflow_s_ui_is_the_configured_tracking_store(tmp_path, monkeypatch):
    """An http(s) tracking URI is a server, and the server is the UI: nothing local is served, and the address has
    no credentials. A database URI is served as is; only with none set is it the runs directory's sqlite file."""
    monkeypatch.setenv("DRAGON_RUNS_DIR", str(tmp_path / "runs"))
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_UI_URL"):
        monkeypatch.delenv(name, raising=False)
    local = mlflow_ui_plan("127.0.0.1", 5077)
    assert local.store == f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}" and local.address == "http://127.0.0.1:5077"
    assert local.store == MLflowTracking().uri, "the store the resource logs to"

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "https://ops:t0ken@mlflow.internal:5443/mlflow/")
    remote = mlflow_ui_plan("127.0.0.1", 5077)
    assert remote.store is None and remote.address == "https://mlflow.internal:5443/mlflow"
    assert remote.setting == "$MLFLOW_TRACKING_URI" == MLflowTracking().setting
    assert MLflowTracking().ui == remote.address, "the links point at the server too"
    monkeypatch.setenv("MLFLOW_UI_URL", "https://mlflow.example")
    assert MLflowTracking().ui == "https://mlflow.example", "unless the UI's address is set"

    database = "postgresql://mlflow:pw@db.internal:5432/mlflow"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", database)
    assert mlflow_ui_plan("127.0.0.1", 5077).store == database == MLflowTracking().uri
    assert mlflow_ui_plan("127.0.0.1", 5077, tracking_uri="http://h:5000").store is None, "the resource's wins"
    assert MLflowTracking(tracking_uri="http://h:5000").setting == "MLflowTracking.tracking_uri"


def make_ui(env: dict[str, str]) -> list[str]:
    """The commands `make ui` would run with env, without running them (install taken as done)."""
    done = subprocess.run(
        ["make", "-s", "-n", "-o", "install", "ui", "MLFLOW_PORT=5077", "DAGSTER_PORT=3077"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.splitlines()


def test_make_ui_serves_the_configured_stores(tmp_path):
    """With a deployment's env loaded, `make ui` keeps its runs directory, serves Dagster from DAGSTER_POSTGRES_URL
    and leaves MLflow to `dragon mlflow-ui` (above), never `mlflow ui` on the checkout's runs/mlflow.db."""
    deployed = {
        **os.environ,
        "DRAGON_RUNS_DIR": str(tmp_path / "runs"),
        "MLFLOW_TRACKING_URI": "http://mlflow.internal:5000",
        "DAGSTER_POSTGRES_URL": "postgresql+psycopg2://dagster:pw@db.internal:5432/dagster",
    }
    commands = make_ui(deployed)
    assert not any("mlflow.db" in line or "mlflow ui" in line for line in commands), commands
    assert any("dragon mlflow-ui --host 127.0.0.1 --port 5077" in line for line in commands), commands
    [banner] = [line for line in commands if line.startswith("echo ")]
    shown = subprocess.run(["bash", "-c", banner], capture_output=True, text=True, check=True).stdout
    assert shown.startswith("Dagster UI: http://127.0.0.1:3077 ") and "instance: postgres" in shown
    # what make passes on: the deployment's runs directory, not the checkout's
    printed = subprocess.run(
        ["make", "-s", "--eval", "print-runs:\n\t@echo $$DRAGON_RUNS_DIR", "print-runs"],
        cwd=ROOT,
        env=deployed,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.strip()
    assert printed == str(tmp_path / "runs")

    alone = {k: v for k, v in os.environ.items() if k not in ("DAGSTER_POSTGRES_URL", "DAGSTER_INSTANCE")}
    assert (
        "instance: sqlite"
        in subprocess.run(
            ["bash", "-c", next(line for line in make_ui(alone) if line.startswith("echo "))],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
