"""`dragon`: what people do outside the Dagster UI: the demo, generating, comparing and listing runs."""

from __future__ import annotations

import functools
import json
import os
import shutil
import sys
import time
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

# Wide enough that tables of paths and metrics are not cut when piped or captured.
console = Console(width=None if sys.stdout.isatty() else 220)
# the instance settings, shipped in the package (not the repository root, where `dagster dev` would warn about them)
PROJECT_DAGSTER_YAML = Path(__file__).resolve().parent / "instance" / "dagster.yaml"


def ensure_dagster_home() -> Path:
    """Use $DAGSTER_HOME, else ./.dagster_home, with the project's instance settings in it."""
    home = Path(os.environ.setdefault("DAGSTER_HOME", str(Path.cwd() / ".dagster_home"))).resolve()
    home.mkdir(parents=True, exist_ok=True)
    if not (home / "dagster.yaml").exists() and PROJECT_DAGSTER_YAML.exists():
        shutil.copyfile(PROJECT_DAGSTER_YAML, home / "dagster.yaml")
    return home


def one_line(text) -> str:
    return " ".join(str(text).split())


class OneLineError(click.ClickException):
    """An expected error, shown as one line on stderr with exit code 1."""

    exit_code = 1

    def show(self, file=None) -> None:
        click.echo(f"Error: {self.format_message()}", err=True)


def expected(exc: BaseException) -> bool:
    """Errors that mean bad input or a missing thing, not a bug: ValueError (DataError, PipelineError and
    the other checks are ValueErrors), a missing file or module, click's usage errors, and the project's own
    *Error classes (ModelError, TrainingError, BackendError ...)."""
    if isinstance(exc, (click.exceptions.Exit, click.Abort, getattr(click.exceptions, "NoArgsIsHelpError", ()))):
        return False
    if isinstance(exc, (ValueError, FileNotFoundError, ModuleNotFoundError, click.ClickException)):
        return True
    if any(c.__name__ == "MlflowException" for c in type(exc).__mro__):  # a server down, a name unknown to it
        return True
    return any(c.__module__.startswith("dragon_dagster.") and c.__name__.endswith("Error") for c in type(exc).__mro__)


class DragonGroup(click.Group):
    """Every command's expected errors print one line and exit 1; --debug (or DRAGON_DEBUG=1) shows the
    traceback instead."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except Exception as exc:  # noqa: BLE001 - re-raised unless expected
            if isinstance(exc, OneLineError) or not expected(exc) or ctx.params.get("debug"):
                raise
            if isinstance(exc, click.ClickException):
                where = getattr(getattr(exc, "ctx", None), "command_path", None)
                message = f"{where}: {exc.format_message()}" if where else exc.format_message()
            else:
                message = str(exc) or type(exc).__name__
            raise OneLineError(one_line(message)) from None


@click.group(name="dragon", cls=DragonGroup)
@click.option(
    "--debug",
    is_flag=True,
    envvar="DRAGON_DEBUG",
    help="Show the traceback of an error instead of one line (also DRAGON_DEBUG=1).",
)
def main(debug: bool):
    """Post-train small language models as Dagster assets tracked in MLflow."""


@main.command()
@click.option("--pipeline", default="support", show_default=True, help="Pipeline name (its attributes' name:).")
@click.option("--profile", default="quick", show_default=True, help="Profile of overrides from the YAML; '' for none.")
@click.option(
    "--defs-module",
    default=None,
    help="Definitions module to find the pipeline in. Default: the Dagster project in the current "
    "directory (pyproject.toml), else dragon_dagster.definitions.",
)
@click.option(
    "--fresh",
    is_flag=True,
    help="Make every stage anew, even where an earlier run made the same thing (same settings, same inputs).",
)
def demo(pipeline: str, profile: str, defs_module: str | None, fresh: bool):
    """Materialize a whole pipeline end to end and print stage times and artifact paths.

    A stage whose settings and inputs have not changed since a run made it is reused, not trained again (the
    table says so); --fresh makes everything anew. A pipeline without the asked profile runs without one (and
    says so)."""
    ensure_dagster_home()
    from .assets.launch import find_pipeline, load_definitions, materialize_pipeline
    from .engine.runtime.warm import client as warm

    started = time.time()
    warm.prestart(dict(os.environ))  # its imports overlap the dataset steps; the first training job forks from it
    found = find_pipeline(pipeline, load_definitions(defs_module))
    if profile and profile not in found.profiles:
        having = f"its profiles are {', '.join(sorted(found.profiles))}" if found.profiles else "it has none"
        click.echo(f"pipeline {pipeline!r} has no profile {profile!r} ({having}): running without a profile", err=True)
        profile = ""
    from .assets.reuse import FRESH_TAG

    outcome = materialize_pipeline(found, profile or None, tags={FRESH_TAG: "true"} if fresh else None)
    table = Table(title=f"{pipeline} pipeline, profile {profile or 'none'}")
    for column in ("asset", "seconds", "status", "made"):
        table.add_column(column)
    for row in outcome["stages"]:
        made = f"reused (run {row['reused_from_run'][:8]})" if row.get("reused_from_run") else ""
        table.add_row(row["asset"], f"{row['seconds']:.1f}", row["status"], made or ("new" if row["artifact"] else ""))
    console.print(table)
    reused = [row for row in outcome["stages"] if row.get("reused_from_run")]
    if reused:
        everything = len(reused) == sum(1 for row in outcome["stages"] if row["artifact"])
        console.print(
            f"{len(reused)} stage(s) reused: their settings and inputs have not changed since an earlier run made them"
            + (", so nothing was trained" if everything else "")
            + " (`--fresh` makes them anew; `dragon status` says what is out of date)."
        )
    for row in outcome["stages"]:
        if row.get("artifact"):
            console.print(f"{row['asset']}: {row['artifact']}", soft_wrap=True)
    console.print(f"total {time.time() - started:.1f} s; Dagster run {outcome['run_id']}")
    for check in outcome["checks"]:  # a failed WARN check is a warning: the run went on, its figures are worth a look
        verdict = "passed" if check["passed"] else ("FAILED" if check["severity"] == "ERROR" else "warning")
        why = "" if check["passed"] or not check.get("description") else f" - {one_line(check['description'])}"
        console.print(f"check {check['asset']} {check['name']}: {verdict}{why}", soft_wrap=True, markup=False)
    if outcome.get("report"):
        console.print(f"evaluation report: {outcome['report']}/report.md")
    print_registry(found.name)
    print_exports(outcome["stages"])
    from .resources.tracking import MLflowTracking, dagster_ui_url

    tracking = MLflowTracking()
    console.print(f"Open the UIs with `make ui`: Dagster {dagster_ui_url()}, MLflow {tracking.ui}", soft_wrap=True)
    # its run page: Dagster's Overview timeline shows only runs launched through a code location (the UI, a sensor,
    # a schedule), and this one ran in this process
    console.print(
        f"This run's steps, logs and checks in Dagster: {dagster_ui_url()}/runs/{outcome['run_id']}",
        soft_wrap=True,
        markup=False,
    )
    for what, url in (
        ("Compare the runs (each pipeline run, its stages nested under it)", tracking.runs_url(found.name)),
        ("Base and merged side by side, row by row", evaluation_link(outcome.get("report"))),
        ("The system prompt's versions and which is live", found.system_prompt() and tracking.prompt_url(found.name)),
        ("Every chat turn (`dragon chat`) as a trace, ratings on it", tracking.ui_page(found.name, "traces")),
    ):
        if url:
            console.print(f"{what} in MLflow: {url}", soft_wrap=True, markup=False)
    if not outcome["success"]:
        raise SystemExit(1)


def evaluation_link(report_dir: str | None) -> str | None:
    """The report's MLflow evaluation link (the merged run compared to the base run, both selected), if it has one."""
    if not report_dir:
        return None
    try:
        report = json.loads((Path(report_dir) / "report.json").read_text())
    except (OSError, ValueError):
        return None
    return ((report or {}).get("mlflow_evaluation") or {}).get("url")


def print_registry(pipeline: str) -> None:
    """Which registered versions the demo left as champion and challenger."""
    from .engine.release.model_registry import CHALLENGER, CHAMPION, alias_version
    from .resources.tracking import MLflowTracking

    client = MLflowTracking().client()
    for alias in (CHAMPION, CHALLENGER):
        version = alias_version(client, pipeline, alias)
        console.print(f"models:/{pipeline}@{alias}: " + (f"version {version}" if version else "none yet"))


def print_exports(stages: list[dict]) -> None:
    """Where the demo's GGUF files and Modelfile are, and the line that makes them an Ollama model."""
    from .engine.artifacts.manifest import ExportManifest, manifest_kind, read_manifest

    for row in stages:
        if row.get("artifact") and manifest_kind(row["artifact"]) == "gguf_export":
            manifest = read_manifest(row["artifact"], ExportManifest)
            for f in manifest.files:
                console.print(f"GGUF {f.format}: {f.path}", soft_wrap=True, markup=False)
            if manifest.ollama_create:
                console.print(f"Ollama: {manifest.ollama_create}", soft_wrap=True, markup=False)


@main.command()
@click.argument("target")
@click.argument("prompts", nargs=-1, required=True)
@click.option("--base", is_flag=True, help="Use the base model the target was trained from.")
@click.option("--max-new-tokens", default=128, show_default=True)
@click.option("--temperature", default=0.0, show_default=True, help="0 is greedy.")
@click.option("--system", default=None, help="System prompt.")
def generate(
    target: str, prompts: tuple[str, ...], base: bool, max_new_tokens: int, temperature: float, system: str | None
):
    """Reply to PROMPTS with TARGET: an adapter or merged-model artifact dir, an asset like support/sft_adapter,
    or a registered model like models:/support@champion."""
    from .engine.infer.generation import generate as generate_replies
    from .engine.models import load_artifact_model

    model, tokenizer, described = load_artifact_model(resolve_target(target), base=base)
    console.print(f"[dim]{described}[/dim]")
    messages = [
        ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": p}] for p in prompts
    ]
    for prompt, reply in zip(
        prompts, generate_replies(model, tokenizer, messages, max_new_tokens=max_new_tokens, temperature=temperature)
    ):
        console.print(f"[bold]> {prompt}[/bold]\n{reply}\n")


@main.command()
@click.argument("target")
@click.argument("prompt")
@click.argument("replies", nargs=-1, required=True)
@click.option("--system", default=None, help="System prompt.")
def score(target: str, prompt: str, replies: tuple[str, ...], system: str | None):
    """Score REPLIES to PROMPT with the reward model TARGET: a reward_model stage's artifact dir or its asset, like
    support/taste_model. Higher is preferred; the scores rank replies, their scale is the model's own."""
    from .engine import catalog
    from .engine.artifacts.manifest import AdapterManifest, read_manifest
    from .engine.infer.reward_model import load_scorer

    directory = resolve_target(target)
    manifest = read_manifest(directory, AdapterManifest)
    if not catalog.scores_replies(manifest.settings.get("kind")):
        raise click.BadParameter(f"{target!r} is a {manifest.method} adapter, not a reward model")
    scorer = load_scorer(manifest.resolved_model, directory / "adapter")
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    scores = scorer.score([messages] * len(replies), list(replies))
    console.print(f"[dim]reward model {manifest.stage} on {manifest.resolved_model}[/dim]")
    for reply, value in sorted(zip(replies, scores), key=lambda pair: -pair[1]):
        console.print(f"{value:+.3f}  {reply}")


def resolve_target(target: str) -> Path:
    """A directory, an asset name like support/merged_model (its latest artifact), or a registered model:
    models:/support@champion, models:/support/3."""
    if target.startswith("models:/"):
        from .resources.tracking import MLflowTracking

        return MLflowTracking().resolve(target)
    path = Path(target)
    if path.exists():
        return path
    from .engine.runs import latest_artifact

    found = latest_artifact(runs_dir(), target)
    if found is None:
        raise click.BadParameter(f"{target!r} is neither a directory nor a materialized asset under {runs_dir()}")
    return found


def runs_dir() -> Path:
    from .resources.storage import default_runs_dir

    return default_runs_dir()


def deployed(pipeline: str) -> Path:
    """The model people chat with: the champion in the MLflow Model Registry, else the latest merged model."""
    return deployed_named(pipeline)[0]


def deployed_named(pipeline: str) -> tuple[Path, str]:
    """deployed()'s directory and its name for people: `models:/<pipeline>@champion (version N)`, or `latest
    merged model (not yet promoted): <dir name>`."""
    from .resources.tracking import MLflowTracking

    live = MLflowTracking().live_model_named(pipeline, runs_dir())
    if live is None:
        raise click.ClickException(
            f"no champion in the model registry and no merged model for pipeline "
            f"{pipeline!r} yet: run `make demo` first, or pass --model"
        )
    return live


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


@main.command()
@pipeline_argument
@click.option("--pipeline", default=None, help="Pipeline name (or give it as the first argument).")
@click.option(
    "--defs-module",
    default=None,
    help="Definitions module to find the pipeline in. Default: the Dagster project in the current "
    "directory (pyproject.toml), else dragon_dagster.definitions.",
)
def status(pipeline: str, defs_module: str | None):
    """Which stages of PIPELINE are out of date, and why: Dagster's "unsynced", from its instance.

    A stage is unsynced when its version changed since it was made (its settings, a file it reads, the base
    model, its kind's code) or a stage it reads was made again or is unsynced; `dragon demo` then makes only
    those, and reuses the rest."""
    ensure_dagster_home()
    from dagster import DagsterInstance

    from .assets.factory import build_pipeline_defs
    from .assets.launch import find_pipeline, load_definitions
    from .assets.status import stage_states

    found = find_pipeline(pipeline, load_definitions(defs_module))
    states = stage_states(found, build_pipeline_defs(found)["assets"], DagsterInstance.get())
    table = Table(title=f"{found.name}: stages against the Dagster instance at {os.environ['DAGSTER_HOME']}")
    for column in ("stage", "status", "version", "why"):
        table.add_column(column)
    for state in states:
        table.add_row(state.name, state.status, state.code_version or "", "; ".join(state.reasons))
    console.print(table)
    behind = [s.name for s in states if s.status != "fresh"]
    console.print(
        f"{len(behind)} of {len(states)} out of date or never made: {', '.join(behind)}"
        if behind
        else "every stage is up to date: a run with the settings that made them reuses them all"
    )


def chat_options(f):
    for option in reversed(
        [
            pipeline_argument,
            click.option(
                "--pipeline",
                default=None,
                help="Whose deployed model and feedback (default: support; or the first argument).",
            ),
            click.option(
                "--model",
                default=None,
                help="A model dir, artifact, models:/NAME@ALIAS, preset, or server URL (with --server-model). "
                "Default: models:/PIPELINE@champion.",
            ),
            click.option("--server-model", default=None, help="With --model http://...: the served model's name."),
            click.option(
                "--system",
                default=None,
                help="System prompt. Default: the pipeline's own (the one every training row carries, so "
                "feedback is stored with it); --system '' sends none.",
            ),
            click.option(
                "--context-turns",
                type=click.IntRange(min=0),
                default=None,
                help="Send only the last N earlier exchanges. Default: the whole conversation.",
            ),
        ]
    ):
        f = option(f)
    return f


def feedback_store(store, pipeline: str):
    """The pipeline's feedback store, reached now: a store URL that is wrong or a server that is down is one
    clear error (naming the setting, never the password) before any chat starts."""
    from .engine.data.feedback_turns import FeedbackError

    try:
        found = store.feedback_store(pipeline)
        found.check()
    except (FeedbackError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    return found


def chat_target(pipeline: str, model: str | None, server_model: str | None):
    """(backend spec, label recorded with feedback, feedback store)."""
    return chat_target_named(pipeline, model, server_model)[:3]


def chat_target_named(pipeline: str, model: str | None, server_model: str | None):
    """(backend spec, label recorded with feedback, feedback store, the model's name for people). The
    label is what identifies the model exactly (its directory, or the server's URL); the name is what the chat
    page's header shows: the registry's name for the deployed model or a models:/ URI (`models:/support@champion
    (version 3)`), else what was asked for."""
    from .resources.storage import ArtifactStore

    store_path = feedback_store(ArtifactStore(), pipeline)
    if model and model.startswith(("http://", "https://")):
        spec = {"type": "server", "base_url": model, "model": server_model or "default"}
        return spec, model, store_path, f"{server_model} at {model}" if server_model else model
    name = model
    if model is None:
        found, name = deployed_named(pipeline)
        target = str(found)
    elif model.startswith("models:/"):
        from .engine.release.model_registry import alias_version, parse_uri
        from .resources.tracking import MLflowTracking

        target = str(resolve_target(model))
        ref = parse_uri(model)  # resolve_target has read it: a valid URI
        if ref.alias:
            version = alias_version(MLflowTracking().client(), ref.name, ref.alias)
            name = f"{model} (version {version})" if version is not None else model
    elif Path(model).exists() or (runs_dir() / "artifacts" / model).exists():  # a directory or an asset name
        target = str(resolve_target(model))
    else:  # a preset or a hub id
        target = model
    return {"type": "local", "model": target}, target, store_path, name


def chat_pipeline(pipeline: str):
    """The pipeline from the loaded definitions, or the exception that says why it is not there (not found,
    definitions that do not load): a chat with --model goes on without it."""
    from .assets.launch import find_pipeline

    try:
        return find_pipeline(pipeline)
    except Exception as exc:  # noqa: BLE001 - handed to the caller, which says it or raises
        return exc


def chat_system(pipeline: str, system: str | None, model: str | None, found=None) -> str | None:
    """The system prompt to chat with: --system when given ('' for none), else the pipeline's own
    (Pipeline.system_prompt(), what its model trained after). A pipeline not in the loaded definitions has none
    with --model (any model can be chatted with), and is an error for its deployed model (its feedback would
    be stored without the prompt it trains with). found: chat_pipeline(pipeline), when already looked up."""
    if system is not None:
        return system.strip() or None
    found = chat_pipeline(pipeline) if found is None else found
    try:
        if isinstance(found, Exception):
            raise found
        return found.system_prompt()
    except Exception as exc:  # not found, or definitions that do not load
        if model is not None:
            console.print(
                f"no system prompt: pipeline {pipeline!r} not found ({one_line(exc)})",
                style="dim",
                soft_wrap=True,
                markup=False,
            )
            return None
        raise click.ClickException(
            f"cannot find the system prompt of pipeline {pipeline!r}: {one_line(exc)}; "
            f"pass --system TEXT (or --system '' for none)"
        ) from exc


def chat_prompt(pipeline: str, system: str | None, model: str | None, found=None) -> tuple[str | None, str | None]:
    """(system prompt, its prompts:/ URI): --system as given (unregistered), else the live version of the
    pipeline's system prompt in MLflow's Prompt Registry, else the pipeline's own text (chat_system) while it is
    not registered yet. A registry that cannot be read leaves the chat on the pipeline's text, and says so."""
    text = chat_system(pipeline, system, model, found)
    if system is not None or text is None:
        return text, None
    from .engine.release.model_registry import RegistryError
    from .engine.release.prompt_registry import system_of
    from .resources.tracking import MLflowTracking

    tracking = MLflowTracking()
    try:
        return system_of(tracking.client(), pipeline, text)
    except RegistryError as exc:
        console.print(
            f"the Prompt Registry at {tracking.shown_uri} cannot be read ({one_line(exc)}): chatting with the "
            "pipeline's own system prompt",
            style="bold yellow",
            soft_wrap=True,
            markup=False,
        )
        return text, None


def chat_tools(found, spec: dict):
    """The pipeline's tools for the chat (a Toolset), or None: the pipeline declares none or was not found, or
    the model is a server's. Tools run only with a local model (engine/infer/backends.py says why), so a server
    chat says it goes on without them."""
    tools = getattr(found, "tools", None)
    if tools is None:
        return None
    from .engine.tools.declare import Toolset

    toolset = Toolset.from_settings(tools)
    names = ", ".join(toolset.names)
    if spec.get("type") == "server":
        console.print(
            f"the pipeline's tools ({names}) run only with a local model: this chat with a server has none",
            style="bold yellow",
            soft_wrap=True,
            markup=False,
        )
        return None
    console.print(
        f"tools: {names} (at most {toolset.max_calls} call(s) a turn, {toolset.timeout:g} s each)",
        style="dim",
        soft_wrap=True,
        markup=False,
    )
    return toolset


def chat_tracer(pipeline: str, name: str, user: str | None = None, system_prompt_uri: str | None = None):
    """The ChatTracer of a chat: its turns as traces in the pipeline's MLflow experiment, at the tracking URI the
    pipeline's runs use. The process's global tracking URI is left alone (the tracer points MLflow's exporter
    there only while it writes a trace: tests run these commands in-process). None, said, when that store
    cannot be used: the chat goes on untraced, its feedback still stored."""
    import getpass
    import re

    from .engine.infer.tracing import ChatTracer
    from .resources.tracking import MLflowTracking

    tracking = MLflowTracking()
    try:
        experiment_id = tracking.experiment_id(pipeline)
    except Exception as exc:  # noqa: BLE001 - any client failure: chat untraced, and say why
        console.print(
            f"warning: not tracing this chat: MLflow at {tracking.shown_uri} cannot be used ({type(exc).__name__}: "
            f"{str(exc)[:300]})",
            style="bold yellow",
            soft_wrap=True,
            markup=False,
        )
        return None
    console.print(
        f"each turn is an MLflow trace in experiment {pipeline!r} ({experiment_id}) at {tracking.shown_uri}; ratings "
        "and edits are assessments on it",
        style="dim",
        soft_wrap=True,
        markup=False,
    )
    found = re.match(r"(models:/\S+)(?: \(version (\d+)\))?", name or "")
    return ChatTracer(
        tracking.uri,
        experiment_id,
        user=user or getpass.getuser(),
        model_uri=found.group(1) if found else None,
        model_version=found.group(2) if found else None,
        system_prompt_uri=system_prompt_uri,
    )


def system_note(system: str | None, uri: str | None = None) -> str:
    return (
        (f"system prompt {uri}: {system!r}" if uri else f"system prompt: {system!r}") if system else "no system prompt"
    )


@main.command()
@chat_options
def chat(pipeline, model, server_model, system, context_turns):
    """Chat in the terminal; /up, /down, /edit TEXT, /undo, /regen, /reset, /save PATH, /history, /quit."""
    from .engine.infer.chat import Chat, run_terminal

    spec, label, store_path, name = chat_target_named(pipeline, model, server_model)
    found = chat_pipeline(pipeline)
    system, prompt_uri = chat_prompt(pipeline, system, model, found)
    tracer = chat_tracer(pipeline, name, system_prompt_uri=prompt_uri)
    console.print(
        f"chatting with {label}; feedback goes to {store_path.where}; {system_note(system, prompt_uri)}; context: "
        + ("all earlier exchanges" if context_turns is None else f"the last {context_turns} exchange(s)")
        + ". /help lists commands.",
        style="dim",
        soft_wrap=True,
        markup=False,
    )
    toolset = chat_tools(found, spec)
    run_terminal(
        Chat(
            spec,
            system=system,
            context_turns=context_turns,
            model_label=label,
            store=store_path,
            toolset=toolset,
            tracer=tracer,
        )
    )


def login_options(f):
    """--password-env and --username: a web page behind a login."""
    f = click.option("--username", default="dragon", show_default=True, help="The login name with --password-env.")(f)
    return click.option(
        "--password-env",
        default=None,
        metavar="NAME",
        help="Require a login, with the password read from environment variable NAME.",
    )(f)


def password_from(password_env: str | None) -> str | None:
    """The password in environment variable password_env (None without one): from the environment only, since a
    command line shows up in ps and shell history."""
    if not password_env:
        return None
    password = os.environ.get(password_env)
    if not password:
        raise click.ClickException(f"--password-env {password_env}: that environment variable is empty or unset")
    return password


def project_defs_dir() -> Path:
    """The defs folder of the Dagster project in the current directory (its pyproject's root module), else ./defs."""
    from .assets.launch import DEFAULT_MODULE, project_module

    module = project_module()
    if module == DEFAULT_MODULE:
        return Path.cwd() / "defs"
    return Path.cwd() / Path(*module.split(".")[:-1]) / "defs"


@main.command()
@click.option(
    "--defs",
    "defs_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The folder pipelines are written into. Default: the defs folder of the Dagster project in the current "
    "directory (its pyproject's root module), else ./defs.",
)
@click.option("--model", default="smollm2-135m", show_default=True, help="The model the page starts with.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Anything but loopback needs --password-env.")
@click.option("--port", default=7861, show_default=True)
@login_options
def studio(defs_dir: Path | None, model: str, host: str, port: int, password_env: str | None, username: str):
    """A web page from a data file to a trained model: map its columns, preview the rows, save the pipeline as
    defs/<name>/defs.yaml, run it and follow it."""
    from .studio import Studio, build_studio, start

    password = password_from(password_env)
    ensure_dagster_home()
    defs_dir = (defs_dir or project_defs_dir()).resolve()
    defs_dir.mkdir(parents=True, exist_ok=True)
    console.print(
        f"studio on http://{host}:{port}  (pipelines written to {defs_dir}; runs in {runs_dir()}; "
        f"{'login ' + repr(username) if password else 'no password'})",
        soft_wrap=True,
        markup=False,
    )
    start(build_studio(Studio(defs_dir, runs_dir(), model)), host=host, port=port, password=password, username=username)


@main.command("chat-ui")
@chat_options
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Interface to bind; anything but loopback needs --password-env (feedback is trained on).",
)
@click.option("--port", default=7860, show_default=True)
@login_options
def chat_ui(pipeline, model, server_model, system, context_turns, host, port, password_env, username):
    """A web chat page (Gradio) with thumbs, edits, regenerate, undo and transcripts."""
    from .chat_ui import exposure_warning, launch

    password = password_from(password_env)
    spec, label, store_path, name = chat_target_named(pipeline, model, server_model)
    found = chat_pipeline(pipeline)
    system, prompt_uri = chat_prompt(pipeline, system, model, found)
    toolset = chat_tools(found, spec)
    tracer = chat_tracer(pipeline, name, user=username if password else None, system_prompt_uri=prompt_uri)
    warning = exposure_warning(host, password)
    if warning:
        console.print(f"warning: {warning}", style="bold yellow", soft_wrap=True, markup=False)
    login = f"login {username!r}, password from ${password_env}" if password else "no password"
    described = name if label in name else f"{name} at {label}"
    console.print(
        f"chat page on http://{host}:{port}  (model {described}; feedback to {store_path.where}; "
        f"{system_note(system, prompt_uri)}; "
        f"{login})",
        soft_wrap=True,
        markup=False,
    )
    launch(
        spec,
        store_path,
        host=host,
        port=port,
        system=system,
        context_turns=context_turns,
        model_label=label,
        model_name=name,
        password=password,
        username=username,
        warn=False,
        toolset=toolset,
        tracer=tracer,
    )


@main.command()
@click.argument("target")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True)
@click.option("--device", default="auto", show_default=True, help="auto, cuda, mps or cpu.")
def serve(target: str, host: str, port: int, device: str):
    """Serve TARGET over the OpenAI protocol with `transformers serve` (pip install 'dragon-dagster[serve]').

    TARGET: a merged-model or adapter artifact dir, an asset like support/merged_model, a registered model like
    models:/support@champion, or a model dir.
    Adapters are merged once into a cached directory first.
    """
    import subprocess

    from transformers.utils.import_utils import is_serve_available

    from .engine.models import servable_dir

    if not is_serve_available():  # transformers would say which module is missing, not how to get it
        raise click.ClickException(
            "dragon serve runs `transformers serve`, which needs its serving extra: pip install 'dragon-dagster[serve]'"
        )
    model_dir = servable_dir(resolve_target(target))
    exe = Path(sys.executable).with_name("transformers")
    console.print(
        f"serving {model_dir}\nOpenAI base URL: http://{host}:{port}/v1  (model name: {model_dir})\n"
        f"as a backend: {{type: server, base_url: http://{host}:{port}/v1, model: {model_dir}}}"
    )
    command = [
        str(exe) if exe.exists() else "transformers",
        "serve",
        str(model_dir),
        "--host",
        host,
        "--port",
        str(port),
    ] + ([] if device == "auto" else ["--device", device])
    raise SystemExit(subprocess.call(command))


class GGUFFormat(click.Choice):
    """A choice of the export's GGUF formats (gguf_file.FORMATS), read when the option is parsed or shown:
    importing the export when the CLI starts would add about a second to every command."""

    def __init__(self) -> None:
        super().__init__(())

    @property
    def choices(self):
        from .engine.release.export.gguf_file import FORMATS

        return FORMATS

    @choices.setter
    def choices(self, value) -> None:  # click.Choice.__init__ sets it; the choices are always FORMATS
        pass


@main.command()
@click.argument("target")
@click.option("--ollama", is_flag=True, help="Print the `ollama create` line for the Modelfile.")
@click.option(
    "--out",
    default=None,
    type=click.Path(file_okay=False),
    help="Where to write when TARGET is a model (default: runs/exports/<name>-<time>).",
)
@click.option(
    "--format",
    "formats",
    multiple=True,
    type=GGUFFormat(),
    help="GGUF format(s) to write for a model, each loaded back and its replies compared with the model's "
    "(default: f16 and q8_0).",
)
@click.option("--system", default=None, help="The Modelfile's system prompt, for a model.")
@click.option("--name", default=None, help="Model and file name, for a model (default: its pipeline).")
def export(target: str, ollama: bool, out: str | None, formats: tuple[str, ...], system: str | None, name: str | None):
    """GGUF files of TARGET for llama.cpp and Ollama, with a Modelfile and a model card.

    TARGET: an export artifact or asset (support/gguf_export: its files are listed, nothing is written); or a
    merged model artifact or asset, a models:/NAME@ALIAS, or a model directory, exported now."""
    from .engine.artifacts.manifest import ExportManifest, manifest_kind, read_manifest
    from .engine.release.export.model import EXPORT_SUBDIR, export_model

    source = resolve_target(target)
    if manifest_kind(source) == "gguf_export":
        manifest = read_manifest(source, ExportManifest)
        files, command = [f.model_dump() for f in manifest.files], manifest.ollama_create
        export_dir = source / EXPORT_SUBDIR
    else:
        if (
            (source / "config.json").exists()
            and source.name == "model"
            and manifest_kind(source.parent) == "merged_model"
        ):
            source = source.parent  # a registered model read in place: its artifact has the card's facts
        elif target.startswith("models:/") and name is None:  # downloaded: named after the registered model
            name = target[len("models:/") :].split("@")[0].split("/")[0]
        out_dir = (
            Path(out) if out else runs_dir() / "exports" / f"{name or source.name}-{time.strftime('%Y%m%d-%H%M%S')}"
        )
        formats = {"formats": formats} if formats else {}  # none given: the export's DEFAULT_FORMATS
        info = export_model(source, out_dir, system=system, name=name, **formats)
        files, command, export_dir = info["files"], info["ollama_create"], Path(info["export_dir"])
    for f in files:
        a = f.get("agreement")  # the file loaded back against the model (None: exported before verification)
        agreement = (
            f"{a['token_agreement']:>6.1%} tokens, {a['identical_replies']}/{a['prompts']} replies same" if a else ""
        )
        console.print(
            f"{f['format']:>5}  {f['size_mb']:>8.1f} MB  {agreement}  {f['path']}", soft_wrap=True, markup=False
        )
    console.print(f"model card: {export_dir / 'README.md'}", soft_wrap=True, markup=False)
    if ollama:
        if not command:
            raise click.ClickException(f"{target} was exported without a Modelfile (ollama: false)")
        click.echo(command)


@main.command()
@click.argument("pipeline")
@click.argument("name")
@click.option(
    "--dagster-url",
    default=None,
    help="The Dagster UI, for the runs' links. Default: $DAGSTER_UI_URL, else where `make ui` serves it "
    "(http://127.0.0.1:$DAGSTER_PORT, port 3000 by default).",
)
@click.option(
    "--here",
    is_flag=True,
    help="Run the points one after another in this process (as `dragon demo` does), not through the run queue.",
)
@click.option("--defs-module", default=None, help="With --here: the definitions module (as for `dragon demo`).")
def sweep(pipeline: str, name: str, dagster_url: str | None, here: bool, defs_module: str | None):
    """Submit every point of sweep NAME of PIPELINE (its `sweeps:` in the YAML) as a run of the pipeline's job.

    The runs queue in the Dagster instance and take the training pool one at a time; `make ui` (`dagster dev`, whose
    daemon starts queued runs) runs them. The code location is the one `dagster dev` loads in this directory.
    `dragon compare PIPELINE --sweep NAME` ranks them."""
    ensure_dagster_home()
    from dagster import DagsterInstance

    from .assets.sweep import run_sweep_here, submit_sweep
    from .resources.tracking import dagster_ui_url

    dagster_url = dagster_url or dagster_ui_url()
    with DagsterInstance.get() as instance:
        if here:
            from .assets.launch import find_pipeline, load_definitions

            found = find_pipeline(pipeline, load_definitions(defs_module))
            tag, outcomes = run_sweep_here(found, name, instance)
            submitted = [(point, outcome["run_id"]) for point, outcome in outcomes]
            failed = [point.index for point, outcome in outcomes if not outcome["success"]]
        else:
            found, tag, submitted = submit_sweep(instance, pipeline, name)
    spec = found.sweep(name)
    console.print(f"sweep {tag}: {len(submitted)} points ({spec.method}), ranked by {spec.metric} ({spec.goal})")
    for point, run_id in submitted:
        settings = ", ".join(f"{k}={v}" for k, v in point.settings.items())
        console.print(f"point {point.index}: {settings}", soft_wrap=True, markup=False)
        console.print(f"  run {run_id}  {dagster_url.rstrip('/')}/runs/{run_id}", soft_wrap=True, markup=False)
    queued = "" if here else "queued: `make ui` runs them one at a time. "
    console.print(
        f"{queued}Compare: dragon compare {pipeline} --sweep {tag.split('/')[-1]}", soft_wrap=True, markup=False
    )
    if here and failed:
        console.print(f"points that failed: {failed}", markup=False)
        raise SystemExit(1)


@main.command()
@click.argument("pipeline_name", metavar="[PIPELINE]", required=False)
@click.option("--pipeline", default=None, help="Only this pipeline's experiment (or give PIPELINE).")
@click.option(
    "--sweep",
    "sweep_ref",
    default=None,
    metavar="ID|NAME",
    help="One row per point of a sweep of PIPELINE (its id, or its name for the latest submission), the best named.",
)
@click.option(
    "--runs",
    "run_pair",
    nargs=2,
    default=None,
    metavar="A B",
    help="Two pipeline runs of PIPELINE (Dagster run ids, or their first characters): the settings and stage "
    "versions that differ, beside their figures.",
)
@click.option("--tracking-uri", default=None, help="MLflow tracking URI (default: the runs dir's sqlite store).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def compare(
    pipeline_name: str | None,
    pipeline: str | None,
    sweep_ref: str | None,
    run_pair: tuple[str, str] | None,
    tracking_uri: str | None,
    as_json,
):
    """Every run's figures, read from MLflow: base, each stage and each report side by side; with --sweep, a
    sweep's points ranked by its metric; with --runs A B, what differs between two pipeline runs."""
    from .resources.tracking import MLflowTracking

    pipeline = pipeline_name or pipeline
    tracking = MLflowTracking(tracking_uri=tracking_uri or "")
    if run_pair:
        if not pipeline:
            raise click.UsageError("--runs needs the pipeline: dragon compare PIPELINE --runs A B")
        return compare_runs(tracking, pipeline, *run_pair, as_json)
    if sweep_ref is not None:
        if not pipeline:
            raise click.UsageError("--sweep needs the pipeline: dragon compare PIPELINE --sweep ID|NAME")
        return compare_sweep(pipeline, sweep_ref, tracking.uri, as_json)
    from .engine.runs import comparison

    rows = comparison(tracking.uri, pipeline)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    # eval/loss lines SFT, DPO, the base and the report up; headline is each stage's own figures (GRPO rewards,
    # DPO preference accuracy, task metrics); --json has every metric
    columns = ["experiment", "run", "stage", "status", "eval/loss", "headline", "upstream", "started"]
    table = Table(title="runs in MLflow")
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*[_fmt(row.get(c)) for c in columns])
    console.print(table)


def compare_runs(tracking, pipeline: str, a: str, b: str, as_json: bool) -> None:
    """What differs between two pipeline runs (settings, then stage versions), and their figures side by side."""
    import dataclasses

    from .engine.run_diff import differences, pipeline_run_settings

    client, experiment = tracking.client(), tracking.experiment_id(pipeline)
    left, right = (pipeline_run_settings(client, experiment, ref) for ref in (a, b))
    rows = differences(left, right)
    if as_json:
        click.echo(json.dumps({"a": dataclasses.asdict(left), "b": dataclasses.asdict(right), "differ": rows}))
        return
    names = [f"{run.run_name} ({run.dagster_run_id[:8]})" for run in (left, right)]
    table = Table(title=f"{pipeline}: what differs between two pipeline runs")
    for column in ("setting", *names):
        table.add_column(column)
    for what, x, y in rows:
        table.add_row(what, _fmt(x), _fmt(y))
    for metric in sorted(set(left.figures) | set(right.figures)):
        table.add_row(f"[figure] {metric}", _fmt(left.figures.get(metric)), _fmt(right.figures.get(metric)))
    console.print(table)
    if not rows:
        console.print("the two runs ran the same settings at the same stage versions")


def compare_sweep(pipeline: str, ref: str, tracking_uri: str, as_json: bool) -> None:
    """A sweep's points (from the Dagster instance's run tags) with their metric (from MLflow), the best named."""
    ensure_dagster_home()
    from dagster import DagsterInstance

    from .assets.sweep import sweep_comparison

    with DagsterInstance.get() as instance:
        found = sweep_comparison(instance, tracking_uri, pipeline, ref)
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    keys = list(dict.fromkeys(k for row in found["rows"] for k in row["settings"]))
    table = Table(title=f"sweep {found['sweep']}: {found['metric']} of {found['stage']} ({found['goal']})")
    for column in ["point", *keys, found["metric"], "status", "dagster run"]:
        table.add_column(column)
    best = found["best"]
    for row in found["rows"]:
        mark = " *" if best is not None and row["point"] == best["point"] else ""
        table.add_row(
            f"{row['point']}{mark}",
            *[_fmt(row["settings"].get(k)) for k in keys],
            _fmt(row["metric"]),
            row["status"],
            row["dagster_run_id"],
        )
    console.print(table)
    if best is None:
        console.print(f"no point has logged {found['metric']} yet")
        return
    settings = ", ".join(f"{k}={v}" for k, v in best["settings"].items())
    console.print(
        f"best: point {best['point']} ({settings}): {found['metric']} {_fmt(best['metric'])}, "
        f"Dagster run {best['dagster_run_id']}",
        soft_wrap=True,
        markup=False,
    )


@main.command()
@click.option("--pipeline", default=None)
@click.option(
    "--prune",
    is_flag=True,
    help="Show the artifact directories that no current materialization, registered model version or "
    "running job refers to; with --yes, remove them.",
)
@click.option("--yes", is_flag=True, help="With --prune: remove what it shows.")
@click.option(
    "--archive",
    "to_archive",
    default=None,
    metavar="DIR",
    help="Move an artifact (its directory, or <pipeline>/<stage>/<id>) under archived/: every file kept, gone from "
    "the lists and from what a run reuses. Refused while its run is going or another artifact reads it.",
)
@click.option("--force", is_flag=True, help="With --archive: archive it even though other artifacts read it.")
@click.option("--restore", "to_restore", default=None, metavar="ID", help="Move an archived artifact back.")
@click.option("--archived", "show_archived", is_flag=True, help="List the archived artifacts instead.")
def runs(
    pipeline: str | None,
    prune: bool,
    yes: bool,
    to_archive: str | None,
    force: bool,
    to_restore: str | None,
    show_archived: bool,
):
    """Materialized artifacts, newest first, with their directories; --archive and --restore move one out of the
    way and back; --prune removes what nothing refers to."""
    from .engine import archive
    from .engine.runs import list_artifacts

    if prune:
        return prune_artifacts(pipeline, yes)
    if to_archive:
        where = archive.archive(runs_dir(), to_archive, is_live=live_dagster_runs(), force=force)
        relative = where.relative_to(archive.archived_root(runs_dir()))
        click.echo(f"archived {relative} to {where}; `dragon runs --restore {relative}` brings it back")
        return
    if to_restore:
        click.echo(f"restored {archive.restore(runs_dir(), to_restore)}")
        return
    # plain lines rather than a table, so that directories are never cut and can be copied
    rows = archive.archived(runs_dir(), pipeline) if show_archived else list_artifacts(runs_dir(), pipeline)
    click.echo(f"{'asset':<32} {'kind':<18} {'created':<25} {'mlflow run':<34} directory")
    for row in rows:
        click.echo(
            f"{row['asset']:<32} {row['kind']:<18} {row['created']:<25} "
            f"{(row.get('mlflow_run_id') or '-'):<34} {row['dir']}"
        )
    if not rows:
        of = f" of pipeline {pipeline!r}" if pipeline else ""
        click.echo(f"(no artifacts{of} under {runs_dir() / ('archived' if show_archived else 'artifacts')})", err=True)


def live_dagster_runs():
    """is_live(dagster_run_id): whether that run is queued or going in the Dagster instance."""
    ensure_dagster_home()
    from dagster import DagsterInstance

    from .assets.training import run_is_live

    return run_is_live(DagsterInstance.get())


def referenced_artifacts() -> set[Path]:
    """What must stay: the artifact of each asset's latest materialization in the Dagster instance, every
    artifact a registered model version was made from, and the artifacts of runs still going."""
    from dagster import DagsterInstance, RunsFilter

    from .assets.automation import UNFINISHED
    from .engine.artifacts.manifest import read_manifest
    from .engine.runs import list_artifacts
    from .resources.tracking import MLflowTracking

    ensure_dagster_home()
    keep: set[Path] = set()
    with DagsterInstance.get() as instance:
        for key in instance.get_asset_keys():
            event = instance.get_latest_materialization_event(key)
            path = event and event.asset_materialization and event.asset_materialization.metadata.get("artifact_dir")
            if path is not None:
                keep.add(Path(str(path.value)))
        live = {r.run_id for r in instance.get_runs(RunsFilter(statuses=UNFINISHED))}
    keep |= {
        Path(r["dir"])
        for r in list_artifacts(runs_dir())
        if r["kind"] != "?" and read_manifest(r["dir"]).dagster_run_id in live
    }
    client = MLflowTracking().client()
    for version in client.search_model_versions(max_results=10000):
        if version.tags.get("artifact_dir"):
            keep.add(Path(version.tags["artifact_dir"]))
    return keep


def prune_artifacts(pipeline: str | None, yes: bool) -> None:
    from .engine.artifacts.directories import dir_size, remove_tree
    from .engine.runs import prunable

    removable, kept = prunable(runs_dir(), referenced_artifacts())
    if pipeline:
        removable = [d for d in removable if d.parent.parent.name == pipeline]
    sizes = {d: dir_size(d) for d in removable}
    for directory in removable:
        click.echo(f"{sizes[directory] / 1e6:>10.1f} MB  {directory}")
    total = sum(sizes.values()) / 1e6
    if not removable:
        click.echo(f"nothing to prune: every artifact is referred to ({len(kept)} kept)")
    elif not yes:
        click.echo(
            f"{len(removable)} artifact directories ({total:.1f} MB) are referred to by nothing; "
            f"{len(kept)} kept. Remove them with: dragon runs --prune --yes"
            + (f" --pipeline {pipeline}" if pipeline else "")
        )
    else:
        for directory in removable:
            remove_tree(directory)
        click.echo(f"removed {len(removable)} artifact directories ({total:.1f} MB); {len(kept)} kept")


@main.command()
@click.argument("pipeline", default="support")
@click.option("--register", "text", default=None, metavar="TEXT", help="Register TEXT as a new version (not live).")
@click.option("--set-live", "version", type=int, default=None, metavar="VERSION", help="Make VERSION the live one.")
def prompt(pipeline: str, text: str | None, version: int | None):
    """PIPELINE's system prompt in MLflow's Prompt Registry: its versions, which one is live (chat, export and
    evaluation send it); --register a new text, --set-live a version."""
    from .engine.release.model_registry import RegistryError
    from .engine.release.prompt_registry import LIVE, live_prompt, prompt_name, register_prompt, set_live, versions_of
    from .resources.tracking import MLflowTracking

    tracking = MLflowTracking()
    client = tracking.client()
    try:
        if text is not None:
            if not text.strip():
                raise click.ClickException("--register: the system prompt is empty")
            made, new = register_prompt(client, pipeline, text, "dragon prompt --register", alias=None)
            click.echo(f"{'registered' if new else 'already registered as'} {made.uri}")
        if version is not None:
            click.echo(f"{set_live(client, pipeline, version).uri} is now {LIVE}")
        live = live_prompt(client, pipeline)
        versions = versions_of(client, pipeline)
    except RegistryError as exc:
        raise click.ClickException(f"{exc} (tracking URI {tracking.shown_uri})") from exc
    if not versions:
        click.echo(
            f"{prompt_name(pipeline)} is not registered yet: building the pipeline's chat dataset registers its "
            "system prompt (or dragon prompt --register TEXT)"
        )
        return
    for v in versions:
        mark = f"  <- {LIVE}" if live and v.version == live.version else ""
        click.echo(f"{v.uri}{mark}\n    {v.text!r}")


@main.command()
@click.argument("pipeline", default="support")
@click.option(
    "--promote",
    "version",
    default=None,
    metavar="VERSION",
    help="Make VERSION the champion (a rollback, say): chat, serve and the next retraining use it.",
)
def models(pipeline: str, version: str | None):
    """PIPELINE's model versions in the MLflow Model Registry, newest first, with their aliases."""
    from .engine.release.model_registry import CHAMPION
    from .resources.tracking import MLflowTracking

    tracking = MLflowTracking()
    client = tracking.client()
    if version is not None:
        from .engine.release.model_registry import ModelRef, version_of

        version_of(client, ModelRef(pipeline, version=version))  # an unknown version fails here, named
        before = tracking.promote(pipeline, version, "promoted by hand (dragon models --promote)")
        click.echo(f"models:/{pipeline}@{CHAMPION} is now version {version} (was {before or 'none'})")
    versions = sorted(client.search_model_versions(f"name = '{pipeline}'"), key=lambda v: -int(v.version))
    if not versions:
        raise click.ClickException(
            f"no registered model {pipeline!r} in {tracking.shown_uri}: materialize a merge first"
        )
    aliases = client.get_registered_model(pipeline).aliases
    table = Table(title=f"models:/{pipeline} in {tracking.shown_uri}")
    for column in ("version", "aliases", "asset", "dagster run", "mlflow run", "created", "artifact"):
        table.add_column(column)
    for v in versions:
        table.add_row(
            str(v.version),
            ", ".join(a for a, n in aliases.items() if str(n) == str(v.version)),
            v.tags.get("asset_key", ""),
            v.tags.get("dagster_run_id", "")[:8],
            (v.run_id or "")[:8],
            time.strftime("%Y-%m-%d %H:%M", time.localtime(v.creation_timestamp / 1000)),
            v.tags.get("artifact_dir", ""),
        )
    console.print(table)


@main.command()
def presets():
    """Small instruct models that work well with LoRA."""
    from .engine.models import presets_table

    table = Table(title="model presets")
    rows = presets_table()
    for column in rows[0]:
        table.add_column(column)
    for row in rows:
        table.add_row(*[str(v) for v in row.values()])
    console.print(table)


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


if __name__ == "__main__":
    main()
