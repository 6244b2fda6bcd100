"""The chat front ends (`dragon chat` in the terminal, `dragon chat-ui` in a browser) and the studio page."""

from __future__ import annotations

from pathlib import Path

import click

from ..page_serving import CHAT_PORT, STUDIO_PORT, PageServing
from .common import (
    console,
    ensure_dagster_home,
    page_options,
    pipeline_argument,
    reach_feedback,
    reach_tracking,
    runs_dir,
)
from .group import main


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
            click.option(
                "--server",
                default=None,
                help="An OpenAI-compatible server's base URL, e.g. `dragon serve`'s http://127.0.0.1:8000/v1 "
                "(the same as --model URL); its API key from $DRAGON_API_KEY.",
            ),
            click.option(
                "--server-model",
                default=None,
                help="With --server or --model http://...: the served model's name (default: the pipeline's).",
            ),
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


def server_url(model: str | None, server: str | None) -> str | None:
    if server is None:
        return model
    if model is not None:
        raise click.UsageError("give --server or --model, not both")
    if not server.startswith(("http://", "https://")):
        raise click.BadParameter(f"{server!r} is not an http:// or https:// URL", param_hint="--server")
    return server


def login_note(serving: PageServing) -> str:
    """What the console says of a page's login."""
    return f"login {serving.username!r}" if serving.password else "no password"


def say(text: str, warning: bool) -> None:
    """What the chat target tells people, on the console: warnings bold, notes dim."""
    console.print(text, style="bold yellow" if warning else "dim", soft_wrap=True, markup=False)


def reach_stores(pipeline: str, model: str | None) -> None:
    """The stores a chat cannot start without, reached before its imports: the feedback store, and MLflow's
    registry when the model comes from it (the deployed one, or a models:/ URI). A chat with a model named
    otherwise goes on untraced when MLflow does not answer, and says so."""
    reach_feedback(pipeline)
    if model is None or model.startswith("models:/"):
        reach_tracking()


@main.command()
@chat_options
def chat(pipeline, model, server, server_model, system, context_turns):
    """Chat in the terminal; /up, /down, /edit TEXT, /undo, /regen, /reset, /save PATH, /history, /quit."""
    model = server_url(model, server)
    reach_stores(pipeline, model)
    from ..chat_target import chat_target
    from ..engine.infer.chat import Chat
    from ..terminal_chat import run_terminal

    target = chat_target(pipeline, model, server_model, system, say=say)
    console.print(
        f"chatting with {target.model.label}; feedback goes to {target.store.where}; {target.system_note}; context: "
        + ("all earlier exchanges" if context_turns is None else f"the last {context_turns} exchange(s)")
        + ". /help lists commands.",
        style="dim",
        soft_wrap=True,
        markup=False,
    )
    run_terminal(
        Chat(
            target.model.spec,
            system=target.system,
            context_turns=context_turns,
            model_label=target.model.label,
            store=target.store,
            toolset=target.toolset,
            tracer=target.tracer,
        )
    )


@main.command()
@click.option(
    "--defs",
    "defs_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The folder pipelines are written into: the defs folder the code location of the Dagster project in the "
    "current directory loads (the default); any other folder is refused with that one.",
)
@click.option("--model", default="smollm2-135m", show_default=True, help="The model the page starts with.")
@click.option(
    "--dagster-url",
    default=None,
    help="The Dagster webserver to launch runs through (reloading its code locations first). Default: "
    "$DAGSTER_UI_URL, else where `make ui` serves it; where none answers, a run starts in a process of the studio.",
)
@page_options(STUDIO_PORT)
def studio(defs_dir: Path | None, model: str, dagster_url: str | None, serving: PageServing):
    """A web page from a data file to a trained model: map its columns, preview the rows, save the pipeline as
    defs/<name>/defs.yaml, run it (through the running Dagster webserver, else in-process) and follow it."""
    from ..resources.tracking import dagster_ui_url
    from ..studio import Studio, build_studio, start
    from ..studio.project import ProjectError, writable_defs_dir

    ensure_dagster_home()
    try:
        defs_dir = writable_defs_dir(defs_dir)
    except ProjectError as exc:
        raise click.ClickException(str(exc)) from None
    defs_dir.mkdir(parents=True, exist_ok=True)
    console.print(
        f"studio on http://{serving.host}:{serving.port}  (pipelines written to {defs_dir}; runs in {runs_dir()}; "
        f"{login_note(serving)})",
        soft_wrap=True,
        markup=False,
    )
    # the chat pages it opens are served on its host, behind its login
    page = Studio(defs_dir, runs_dir(), model, dagster_url=dagster_url or dagster_ui_url(), serving=serving)
    start(build_studio(page), serving)


@main.command("chat-ui")
@chat_options
@page_options(CHAT_PORT)
def chat_ui(pipeline, model, server, server_model, system, context_turns, serving: PageServing):
    """A web chat page (Gradio) with thumbs, edits, regenerate, undo and transcripts."""
    model = server_url(model, server)
    reach_stores(pipeline, model)
    from ..chat_target import chat_target
    from ..chat_ui import exposure_warning, serve_target

    user = serving.username if serving.password else None
    target = chat_target(pipeline, model, server_model, system, user=user, say=say)
    warning = exposure_warning(serving.host, serving.password)
    if warning:
        console.print(f"warning: {warning}", style="bold yellow", soft_wrap=True, markup=False)
    label, name = target.model.label, target.model.name
    described = name if label in name else f"{name} at {label}"
    console.print(
        f"chat page on http://{serving.host}:{serving.port}  (model {described}; feedback to {target.store.where}; "
        f"{target.system_note}; {login_note(serving)})",
        soft_wrap=True,
        markup=False,
    )
    serve_target(target, serving, context_turns=context_turns, warn=False)
