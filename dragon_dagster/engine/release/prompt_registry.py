"""The pipeline's system prompt in MLflow's Prompt Registry: versioned, with an alias that says which one is live.

A pipeline's fixed system prompt (`Pipeline.system_prompt()`, the `system:` of the chat dataset its first
training stage reads) is registered as the prompt `<pipeline>-system` when that dataset is built. Its versions
come from two places: the pipeline's YAML (a changed `system:` becomes a new version when the dataset is
rebuilt) and people (a version registered in the MLflow UI or with `dragon prompt register`). The alias `live`
says which version is in use: chat, export and evaluation send that version's text and record its URI
(`prompts:/support-system/3`).

Who moves the alias: a new version from the YAML goes live with the data built on it (the model is trained after
that text), a version a person registers goes live when they say so (`dragon prompt set-live`, or the alias in the
MLflow UI), and rebuilding a dataset whose text is already a version moves nothing, so a version set live by hand
stays live until the YAML's text changes.

Framework-free: takes an MlflowClient, never imports Dagster.
"""

from __future__ import annotations

from dataclasses import dataclass

from .model_registry import RegistryError, _not_found

LIVE = "live"
SOURCE_TAG = "dragon.source"  # where a version came from: the pipeline YAML's dataset, or a person


@dataclass(frozen=True)
class SystemPrompt:
    """One version of a pipeline's system prompt: its text and where it sits in the registry."""

    name: str
    version: int
    text: str

    @property
    def uri(self) -> str:
        return f"prompts:/{self.name}/{self.version}"


def prompt_name(pipeline: str) -> str:
    """The registered prompt holding a pipeline's system prompt ('support' -> 'support-system')."""
    return f"{pipeline}-system"


def _versions(client, name: str) -> list:
    """Every version of the prompt, oldest first; none when it is not registered yet."""
    found, token = [], None
    try:
        while True:
            page = client.search_prompt_versions(name, max_results=100, page_token=token)
            found.extend(page)
            token = page.token
            if not token:
                break
    except Exception as exc:  # noqa: BLE001 - a missing prompt is 'no versions'; anything else is the registry's
        if _not_found(exc):
            return []
        raise RegistryError(f"cannot read prompt {name!r} from the MLflow registry: {exc}") from exc
    return sorted(found, key=lambda v: int(v.version))


def versions_of(client, pipeline: str) -> list[SystemPrompt]:
    """Every version of the pipeline's system prompt, newest first (none before it is first registered)."""
    return [_as_prompt(v) for v in reversed(_versions(client, prompt_name(pipeline)))]


def _as_prompt(version) -> SystemPrompt:
    return SystemPrompt(version.name, int(version.version), version.template)


def live_prompt(client, pipeline: str, alias: str = LIVE) -> SystemPrompt | None:
    """The version the alias points at; None when the pipeline's prompt or the alias is not registered yet."""
    name = prompt_name(pipeline)
    try:
        return _as_prompt(client.get_prompt_version_by_alias(name, alias))
    except Exception as exc:  # noqa: BLE001 - missing is None; a registry that fails says so
        if _not_found(exc) or "not found" in str(exc).lower():
            return None
        raise RegistryError(f"cannot read {name}@{alias} from the MLflow registry: {exc}") from exc


def register_prompt(
    client, pipeline: str, text: str, source: str, alias: str | None = LIVE
) -> tuple[SystemPrompt, bool]:
    """(the version holding `text`, whether it was new). A text already registered is that version again, and the
    alias stays where it is; a new text becomes the next version and, with `alias`, goes live."""
    name = prompt_name(pipeline)
    for version in reversed(_versions(client, name)):
        if version.template == text:
            return _as_prompt(version), False
    try:
        created = client.register_prompt(
            name=name,
            template=text,
            commit_message=f"system prompt from {source}",
            tags={SOURCE_TAG: source, "dragon.pipeline": pipeline},
        )
        if alias:
            client.set_prompt_alias(name, alias, int(created.version))
    except Exception as exc:  # noqa: BLE001 - named, with the registry's own message
        raise RegistryError(f"cannot register the system prompt of {pipeline!r} as {name!r}: {exc}") from exc
    return _as_prompt(created), True


def register_pipeline_prompt(client, pipeline: str, text: str, source: str) -> SystemPrompt:
    """The YAML's text as a version (new when the text changed, then live). An alias missing altogether (a prompt
    registered elsewhere without one) is set to this version, so there is always a live version after a build."""
    prompt, _ = register_prompt(client, pipeline, text, source)
    if live_prompt(client, pipeline) is None:
        client.set_prompt_alias(prompt.name, LIVE, prompt.version)
    return prompt


def set_live(client, pipeline: str, version: int) -> SystemPrompt:
    """Point the live alias at a version (what `dragon prompt set-live` does)."""
    name = prompt_name(pipeline)
    known = {int(v.version): v for v in _versions(client, name)}
    if version not in known:
        raise RegistryError(
            f"prompt {name!r} has no version {version}; it has {sorted(known) or 'none (build the pipeline first)'}"
        )
    client.set_prompt_alias(name, LIVE, version)
    return _as_prompt(known[version])


def system_of(client, pipeline: str, fallback: str | None) -> tuple[str | None, str | None]:
    """(the system prompt to send, its URI): the live version when the pipeline's prompt is registered, else the
    YAML's text unregistered (URI None), e.g. before the pipeline's dataset was first built."""
    live = live_prompt(client, pipeline)
    if live is None:
        return fallback, None
    return live.text, live.uri
