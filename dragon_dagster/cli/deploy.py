"""`dragon dagster-yaml`, `dragon k8s-pod` and `dragon mlflow-ui`: a deployment's Dagster instance settings, the
worker pod the k8s launcher would submit, and MLflow's UI on the store the settings name (`make ui` runs it), never
a local file when a tracking URI is configured."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import click

from .common import PROJECT_DAGSTER_YAML
from .group import main

POSTGRES_STORAGE_YAML = PROJECT_DAGSTER_YAML.with_name("postgres-storage.yaml")


@main.command("dagster-yaml")
@click.option(
    "--postgres",
    is_flag=True,
    help="Keep Dagster's records (runs, event log, schedules) in PostgreSQL: adds instance/postgres-storage.yaml, "
    "whose URL each Dagster process reads from $DAGSTER_POSTGRES_URL.",
)
def dagster_yaml(postgres: bool):
    """Print the Dagster instance settings the package ships (instance/dagster.yaml: the training pool, the run
    queue, run monitoring), for $DAGSTER_HOME/dagster.yaml:

    dragon dagster-yaml --postgres > "$DAGSTER_HOME/dagster.yaml"

    The files are read from the installed package, so this works from any directory, with whichever Python
    `dragon` was installed with."""
    text = PROJECT_DAGSTER_YAML.read_text()
    if postgres:
        text += POSTGRES_STORAGE_YAML.read_text()
    click.echo(text, nl=False)


@main.command("k8s-pod")
@click.argument("config", required=False, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--cpus", type=float, default=1, show_default=True, help="CPUs the pod requests.")
@click.option("--gpus", type=float, default=1, show_default=True, help="GPUs (whole devices) the pod requests.")
@click.option("--memory-gb", type=float, default=0, show_default=True, help="Memory request and limit, GiB; 0: none.")
@click.option("--termination-grace-s", type=float, default=600, show_default=True, help="SIGTERM to SIGKILL.")
def k8s_pod(config: Path | None, cpus: float, gpus: float, memory_gb: float, termination_grace_s: float):
    """Print the worker pod manifest the k8s launcher submits for a k8s config (CONFIG: a YAML file with the mapping
    under the training resource's `k8s:`), to read or to pipe into `kubectl apply --dry-run=server -f -`. It is built
    by dagster-k8s's own build_pod_body, as a run would build it; the Dagster context is a placeholder."""
    import yaml

    from ..resources.launchers.k8s_pod import K8sPod, render_pod

    pod = K8sPod(**((yaml.safe_load(config.read_text()) if config else None) or {}))
    if not pod.image:  # dagster-k8s would refuse it with an invariant error deep in its builder
        where = f"{config} has no image" if config else "no CONFIG given, so the pod has no image"
        raise click.UsageError(f"{where}: set `image: <registry/name:tag>` in the k8s config file")
    manifest = render_pod(
        pod,
        ["python", "-m", "dragon_dagster.engine.runtime.worker", "/runs/<artifact>/.job-run.json"],
        cpus=cpus,
        gpus=gpus,
        memory_gb=memory_gb,
        termination_grace_s=termination_grace_s,
        warn=lambda message: click.echo(message, err=True),
    )
    click.echo(yaml.safe_dump(manifest, sort_keys=False), nl=False)


@dataclass(frozen=True)
class MLflowUI:
    """What serves MLflow's UI for the configured tracking store.

    address: where the UI is (no trailing slash); store: the backend store `mlflow ui` serves there, None when the
    tracking URI names a tracking server (that server is the UI: serving anything else on a local port would show
    another store); setting: where the store came from, for messages."""

    address: str
    store: str | None
    setting: str


def mlflow_ui_plan(host: str = "127.0.0.1", port: int = 5000, tracking_uri: str = "") -> MLflowUI:
    """The UI for the store that MLflowTracking(tracking_uri) logs to: its server when the URI names one
    (http[s]://), else `mlflow ui` on host:port serving that store: the database or file the URI names, or the runs
    directory's sqlite store ($DRAGON_RUNS_DIR/mlflow.db) when no tracking URI is set.

    The same choice as MLflowTracking.uri (a test holds them together), made here without importing the resource:
    that import is MLflow's whole client, ten seconds on a busy machine before `mlflow ui` imports it again."""
    from ..engine.text.uris import tracking_server

    if tracking_uri:
        uri, setting = tracking_uri, "MLflowTracking.tracking_uri"
    elif os.environ.get("MLFLOW_TRACKING_URI"):
        uri, setting = os.environ["MLFLOW_TRACKING_URI"], "$MLFLOW_TRACKING_URI"
    else:
        runs = Path(os.environ.get("DRAGON_RUNS_DIR", Path.cwd() / "runs")).resolve()
        uri, setting = f"sqlite:///{runs / 'mlflow.db'}", "no tracking URI set: the runs directory's store"
    server = tracking_server(uri)
    if server:
        return MLflowUI(server, None, setting)
    return MLflowUI(f"http://{host}:{port}", uri, setting)


@main.command("mlflow-ui")
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to serve on.")
@click.option("--port", type=int, default=5000, show_default=True, envvar="MLFLOW_PORT", help="Also MLFLOW_PORT.")
@click.option("--dry-run", is_flag=True, help="Say what would be served, and start nothing.")
def mlflow_ui(host: str, port: int, dry_run: bool):
    """MLflow's UI on the configured tracking store (`make ui` runs it). When $MLFLOW_TRACKING_URI names a tracking
    server, that server is the UI: its address is printed and nothing is started. Otherwise `mlflow ui` serves the
    database it names (postgresql://...), or the runs directory's sqlite store when none is set
    ($DRAGON_RUNS_DIR/mlflow.db), on host:port; the store's URI reaches it in MLFLOW_BACKEND_STORE_URI, never on
    its command line (which every user of the machine can read)."""
    from ..engine.text.uris import TRAINING_VIEW, without_password

    plan = mlflow_ui_plan(host, port)
    link = f"{plan.address}/#/experiments?{TRAINING_VIEW}"
    if plan.store is None:
        click.echo(f"MLflow UI: {link}  (the tracking server in {plan.setting}: nothing to start here)")
        if not dry_run:
            from ..resources.tracking_store import TrackingStoreError, check_store

            try:
                check_store(plan.address, plan.setting, timeout_s=5)
            except TrackingStoreError as exc:  # the Dagster UI beside it is still worth starting: a warning
                click.echo(
                    f"warning: {exc}. Start that server, or point MLFLOW_TRACKING_URI at one that runs.", err=True
                )
        return
    click.echo(f"MLflow UI: {link}  (serving {without_password(plan.store)}; {plan.setting})")
    if dry_run:
        return
    from ..resources.tracking_store import check_store

    check_store(plan.store, plan.setting)  # a database that does not answer: one line in seconds, not a traceback
    if plan.store.startswith("sqlite:///"):  # `mlflow ui` makes the file, not its folder
        Path(plan.store.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    mlflow = Path(sys.executable).with_name("mlflow")
    sys.stdout.flush()
    env = {**os.environ, "MLFLOW_BACKEND_STORE_URI": plan.store}
    os.execve(mlflow, [str(mlflow), "ui", "--host", host, "--port", str(port)], env)
