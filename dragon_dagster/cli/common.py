"""What the commands share: the console, the Dagster home, the runs folder, the targets people name, the pipeline
argument and the options that say how a web page is served."""

from __future__ import annotations

import functools
import os
import shutil
import sys
from pathlib import Path

import click
from pydantic import ValidationError
from rich.console import Console

from ..page_serving import USERNAME, PageServing

# Wide enough that tables of paths and metrics are not cut when piped or captured.
console = Console(width=None if sys.stdout.isatty() else 220)
# the instance settings, shipped in the package (not the repository root, where `dagster dev` would warn about them)
PROJECT_DAGSTER_YAML = Path(__file__).resolve().parents[1] / "instance" / "dagster.yaml"


def ensure_dagster_home() -> Path:
    """Use $DAGSTER_HOME, else ./.dagster_home, with the project's instance settings in it; its storage reached
    now, as every caller uses the instance next: a PostgreSQL storage that is down or refuses the login is one
    line within seconds (resources/dagster_storage.py), not dagster-postgres's retries and a long traceback."""
    from .dagster_storage import check_dagster_storage

    home = Path(os.environ.setdefault("DAGSTER_HOME", str(Path.cwd() / ".dagster_home"))).resolve()
    home.mkdir(parents=True, exist_ok=True)
    if not (home / "dagster.yaml").exists() and PROJECT_DAGSTER_YAML.exists():
        shutil.copyfile(PROJECT_DAGSTER_YAML, home / "dagster.yaml")
    check_dagster_storage(home)
    return home


def reach_tracking(uri: str | None = None, setting: str = "$MLFLOW_TRACKING_URI") -> None:
    """MLflow's tracking store (uri, named by `setting`; default: $MLFLOW_TRACKING_URI, as MLflowTracking() finds
    it) reached before mlflow is imported (3 s of CPU, 10 s on a busy 2-core machine): a server or database that
    is down or refuses the login, or a server whose own database is down, is one line within seconds
    (engine/outages.py), not MLflow's retries (about 250 s) and a traceback. The runs directory's sqlite store,
    the default, has nothing to reach."""
    from ..engine.outages import check_tracking_store

    if uri:
        check_tracking_store(uri, setting)
    else:
        check_tracking_store(os.environ.get("MLFLOW_TRACKING_URI", ""), "$MLFLOW_TRACKING_URI")


def reach_feedback(pipeline: str) -> None:
    """The pipeline's feedback store, when $DRAGON_FEEDBACK_URL puts it in PostgreSQL, reached before the chat's
    imports (its model, MLflow, the page: 8 s of a busy machine): a server that is down or refuses the login is
    one line within seconds. The chat reaches it again when it starts (chat_target.feedback_store)."""
    from ..engine.data.feedback.postgres import URL_SCHEMES, PostgresFeedbackStore

    url = os.environ.get("DRAGON_FEEDBACK_URL", "")
    if url.startswith(URL_SCHEMES):
        PostgresFeedbackStore(url, pipeline, setting="$DRAGON_FEEDBACK_URL").check()


def one_line(text) -> str:
    return " ".join(str(text).split())


def runs_dir() -> Path:
    from ..resources.storage import default_runs_dir

    return default_runs_dir()


def resolve_target(target: str) -> Path:
    """A directory, an asset name like support/merged_model (its latest artifact), or a registered model:
    models:/support@champion, models:/support/3 (chat_target.resolve_target), as a command's parameter."""
    if target.startswith("models:/"):
        reach_tracking()
    from ..chat_target import ChatTargetError
    from ..chat_target import resolve_target as resolve

    try:
        return resolve(target)
    except ChatTargetError as exc:
        raise click.BadParameter(str(exc)) from None


def pipeline_argument(f):
    """The pipeline as an optional first argument too (`dragon chat-ui support`), the same as --pipeline."""

    @functools.wraps(f)
    def with_pipeline(*args, pipeline_argument=None, pipeline=None, **kwargs):
        if pipeline_argument and pipeline and pipeline_argument != pipeline:
            raise click.UsageError(
                f"two pipelines: {pipeline_argument!r} and --pipeline {pipeline!r}; name it once (either way)"
            )
        return f(*args, pipeline=pipeline_argument or pipeline or "support", **kwargs)

    return click.argument("pipeline_argument", metavar="[PIPELINE]", required=False)(with_pipeline)


def page_options(port: int):
    """--host, --port, --password-env and --username: how a web page (the chat page, the studio) is served, handed
    to the command as one `serving` (page_serving.PageServing); `port` is the page's default."""

    def decorate(f):
        @functools.wraps(f)
        def with_serving(*args, host, port, password_env, username, **kwargs):
            try:
                serving = PageServing(host=host, port=port, password=password_from(password_env), username=username)
            except ValidationError as exc:
                raise click.UsageError(f"how the page is served: {exc}") from None
            return f(*args, serving=serving, **kwargs)

        for option in reversed(
            [
                click.option(
                    "--host",
                    default="127.0.0.1",
                    show_default=True,
                    help="Interface to bind; anything beyond loopback needs --password-env (the page warns without "
                    "one).",
                ),
                click.option("--port", type=click.IntRange(0, 65535), default=port, show_default=True),
                click.option(
                    "--password-env",
                    default=None,
                    metavar="NAME",
                    help="Require a login, with the password read from environment variable NAME.",
                ),
                click.option(
                    "--username", default=USERNAME, show_default=True, help="The login name with --password-env."
                ),
            ]
        ):
            with_serving = option(with_serving)
        return with_serving

    return decorate


def password_from(password_env: str | None) -> str | None:
    """The password in environment variable password_env (None without one): from the environment only, since a
    command line shows up in ps and shell history."""
    if not password_env:
        return None
    password = os.environ.get(password_env)
    if not password:
        raise click.ClickException(f"--password-env {password_env}: that environment variable is empty or unset")
    return password


def fmt(value) -> str:
    """A figure in a table: floats to four significant digits, None as nothing."""
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)
