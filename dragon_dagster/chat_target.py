"""Who a chat talks to and what goes with it, made once for every front end (`dragon chat`, `dragon chat-ui`, the
studio's *Chat*): the model (the pipeline's deployed one, a registered version, an artifact, a preset or a server),
the feedback store, the system prompt (the live one in the Prompt Registry, else the pipeline's own), the
pipeline's tools and the tracer that makes each turn an MLflow trace.

What a front end should tell people (which model, where feedback and traces go, what is missing) comes through
`say(text, warning)`; what stops a chat from starting is a ChatTargetError naming the fix.
"""

from __future__ import annotations

import getpass
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .engine.data.feedback.store import FeedbackStore
from .engine.infer.tracing import ChatTracer
from .engine.tools.declare import Toolset
from .resources.storage import ArtifactStore, default_runs_dir
from .resources.tracking import LiveModel, MLflowTracking

Say = Callable[[str, bool], Any]  # (text, whether it is a warning)
SERVER_KEY_ENV = "DRAGON_API_KEY"  # the API key a chat sends to a --server URL


class ChatTargetError(ValueError):
    """A chat that cannot start: no model to talk to, a store that cannot be reached, no system prompt."""


def _quiet(text: str, warning: bool) -> None:
    return None


def one_line(text) -> str:
    return " ".join(str(text).split())


@dataclass(frozen=True)
class ChatModel:
    """The model of a chat: how to reach it and how it is named."""

    spec: dict  # the backend's settings (infer/backend_registry.py): {"type": "local", "model": ...} or a server's
    label: str  # what identifies it exactly, recorded with each feedback record: its directory or the server's URL
    name: str  # for people: `models:/support@champion (version 3)`, else what was asked for
    uri: str | None = None  # models:/NAME@ALIAS or models:/NAME/N when it came from the Model Registry
    version: str | None = None  # that registered version


@dataclass(frozen=True)
class ChatTarget:
    pipeline: str
    model: ChatModel
    store: FeedbackStore
    system: str | None
    system_uri: str | None  # the prompts:/ URI of the system prompt when it came from the Prompt Registry
    toolset: Toolset | None
    tracer: ChatTracer | None

    @property
    def system_note(self) -> str:
        if not self.system:
            return "no system prompt"
        return (
            f"system prompt {self.system_uri}: {self.system!r}"
            if self.system_uri
            else f"system prompt: {self.system!r}"
        )


def runs_dir() -> Path:
    return default_runs_dir()


def resolve_target(target: str) -> Path:
    """A directory, an asset name like support/merged_model (its latest artifact), or a registered model:
    models:/support@champion, models:/support/3."""
    if target.startswith("models:/"):
        return MLflowTracking().resolve(target)
    path = Path(target)
    if path.exists():
        return path
    from .engine.runs import latest_artifact

    found = latest_artifact(runs_dir(), target)
    if found is None:
        raise ChatTargetError(f"{target!r} is neither a directory nor a materialized asset under {runs_dir()}")
    return found


def deployed(pipeline: str) -> LiveModel:
    """The model people chat with: the champion in the MLflow Model Registry, else the latest merged model."""
    live = MLflowTracking().live_model_named(pipeline, runs_dir())
    if live is None:
        raise ChatTargetError(
            f"no champion in the model registry and no merged model for pipeline "
            f"{pipeline!r} yet: run `make demo` first, or pass --model"
        )
    return live


# How long a rating waits for a feedback store that went away (a restart is ridden out) before the chat keeps it
# and says why: the page's line must come within 10 s, and a host that drops packets costs the connect timeout
# (engine/outages.py's 5 s) on top. What is kept is stored with the session's next rating or edit
# (engine/infer/chat.py's Chat.kept).
RIDE_OUT_S = 3.0


def feedback_store(pipeline: str, store: ArtifactStore | None = None) -> FeedbackStore:
    """The pipeline's feedback store, reached now: a store URL that is wrong or a server that is down is one
    clear error (naming the setting, never the password) before any chat starts."""
    from .engine.data.feedback_turns import FeedbackError

    try:
        found = (store or ArtifactStore()).feedback_store(pipeline, ride_out_s=RIDE_OUT_S)
        found.check()
    except (FeedbackError, ValueError) as exc:
        raise ChatTargetError(str(exc)) from None
    return found


def chat_model(pipeline: str, model: str | None = None, server_model: str | None = None) -> ChatModel:
    """model: None (the pipeline's deployed model), a server URL (with server_model, its served name: by
    default the pipeline's, as `dragon serve` names it), a
    models:/ URI, a directory or an asset name, or a preset or hub id."""
    if model and model.startswith(("http://", "https://")):
        # `dragon serve` serves the pipeline's champion under the pipeline's name: the name to ask for by default
        spec = {"type": "server", "base_url": model, "model": server_model or pipeline}
        if os.environ.get(SERVER_KEY_ENV):  # a server with keys (`dragon serve`'s): the key stays in the environment
            spec["api_key_env"] = SERVER_KEY_ENV
        return ChatModel(spec, model, f"{server_model} at {model}" if server_model else model)
    if model is None:
        live = deployed(pipeline)
        target = str(live.directory)
        return ChatModel({"type": "local", "model": target}, target, live.name, live.uri, live.version)
    if model.startswith("models:/"):
        from .engine.release.model_registry import alias_version, parse_uri

        target = str(resolve_target(model))
        ref = parse_uri(model)  # resolve_target has read it: a valid URI
        version = str(ref.version) if getattr(ref, "version", None) is not None else None
        if ref.alias:
            found = alias_version(MLflowTracking().client(), ref.name, ref.alias)
            version = str(found) if found is not None else None
        name = f"{model} (version {version})" if ref.alias and version else model
        return ChatModel({"type": "local", "model": target}, target, name, model, version)
    if Path(model).exists() or (runs_dir() / "artifacts" / model).exists():  # a directory or an asset name
        target = str(resolve_target(model))
        return ChatModel({"type": "local", "model": target}, target, model)
    return ChatModel({"type": "local", "model": model}, model, model)  # a preset or a hub id


def find_pipeline(pipeline: str):
    """The pipeline from the loaded definitions, or the exception that says why it is not there (not found,
    definitions that do not load): a chat with a model named goes on without it."""
    from .assets.launch import find_pipeline as find

    try:
        return find(pipeline)
    except Exception as exc:  # noqa: BLE001 - handed to the caller, which says it or raises
        return exc


def pipeline_system(pipeline: str, found, model: str | None, say: Say = _quiet) -> str | None:
    """The pipeline's own system prompt (Pipeline.system_prompt(), what its model trained after). A pipeline not
    in the loaded definitions has none when a model is named (any model can be chatted with), and is an error for
    its deployed model (its feedback would be stored without the prompt it trains with)."""
    try:
        if isinstance(found, Exception):
            raise found
        return found.system_prompt()
    except Exception as exc:  # not found, or definitions that do not load
        if model is not None:
            say(f"no system prompt: pipeline {pipeline!r} not found ({one_line(exc)})", False)
            return None
        raise ChatTargetError(
            f"cannot find the system prompt of pipeline {pipeline!r}: {one_line(exc)}; "
            f"pass --system TEXT (or --system '' for none)"
        ) from exc


def system_prompt(
    pipeline: str,
    system: str | None,
    model: str | None,
    found,
    say: Say = _quiet,
    tracking: MLflowTracking | None = None,
) -> tuple[str | None, str | None]:
    """(system prompt, its prompts:/ URI): `system` as given ('' for none; unregistered), else the live version of
    the pipeline's system prompt in MLflow's Prompt Registry, else the pipeline's own text while it is not
    registered yet. A registry that cannot be read leaves the chat on the pipeline's text, and says so."""
    if system is not None:
        return system.strip() or None, None
    text = pipeline_system(pipeline, found, model, say)
    if text is None:
        return None, None
    from .engine.release.model_registry import RegistryError
    from .engine.release.prompt_registry import system_of

    tracking = tracking or MLflowTracking()
    try:
        return system_of(tracking.client(), pipeline, text)
    except RegistryError as exc:
        say(
            f"the Prompt Registry at {tracking.shown_uri} cannot be read ({one_line(exc)}): chatting with the "
            "pipeline's own system prompt",
            True,
        )
        return text, None


def toolset(found, model: ChatModel, say: Say = _quiet) -> Toolset | None:
    """The pipeline's tools for the chat, or None: the pipeline declares none or was not found, or the model is a
    server's. Tools run only with a local model (engine/infer/backend.py says why), so a server chat says it
    goes on without them."""
    tools = getattr(found, "tools", None)
    if tools is None:
        return None
    made = Toolset.from_settings(tools)
    names = ", ".join(made.names)
    if model.spec.get("type") == "server":
        say(f"the pipeline's tools ({names}) run only with a local model: this chat with a server has none", True)
        return None
    say(f"tools: {names} (at most {made.max_calls} call(s) a turn, {made.timeout:g} s each)", False)
    return made


def tracer(
    pipeline: str,
    model: ChatModel,
    user: str | None,
    system_uri: str | None,
    say: Say = _quiet,
    tracking: MLflowTracking | None = None,
) -> ChatTracer | None:
    """The chat's turns as traces in the pipeline's MLflow experiment, at the tracking URI the pipeline's runs
    use. The process's global tracking URI is left alone (the tracer points MLflow's exporter there only while it
    writes a trace). None, said, when that store cannot be used: the chat goes on untraced, its feedback stored."""
    tracking = tracking or MLflowTracking()
    try:
        experiment_id = tracking.experiment_id(pipeline)
    except Exception as exc:  # noqa: BLE001 - any client failure: chat untraced, and say why
        say(
            f"warning: not tracing this chat: MLflow at {tracking.shown_uri} cannot be used ({type(exc).__name__}: "
            f"{str(exc)[:300]})",
            True,
        )
        return None
    say(
        f"each turn is an MLflow trace in experiment {pipeline!r} ({experiment_id}) at {tracking.shown_uri}; "
        "ratings and edits are assessments on it",
        False,
    )
    return ChatTracer(
        tracking.uri,
        experiment_id,
        setting=tracking.setting,
        user=user or getpass.getuser(),
        model_uri=model.uri,
        model_version=model.version,
        system_prompt_uri=system_uri,
    )


def chat_target(
    pipeline: str,
    model: str | None = None,
    server_model: str | None = None,
    system: str | None = None,
    user: str | None = None,
    say: Say = _quiet,
    found=None,
    store: ArtifactStore | None = None,
    tracking: MLflowTracking | None = None,
) -> ChatTarget:
    """Everything a chat with `pipeline`'s model needs (see chat_model for `model`; `system` None: the pipeline's
    live system prompt, '' none; `user`: who the traces name, default the login). found: the Pipeline when the
    caller has it (else it is looked up in the loaded definitions); store and tracking: the resources (default:
    this machine's, from the environment)."""
    feedback = feedback_store(pipeline, store)
    chosen = chat_model(pipeline, model, server_model)
    found = find_pipeline(pipeline) if found is None else found
    text, uri = system_prompt(pipeline, system, model, found, say, tracking)
    tools = toolset(found, chosen, say)
    traced = tracer(pipeline, chosen, user, uri, say, tracking)
    return ChatTarget(pipeline, chosen, feedback, text, uri, tools, traced)
