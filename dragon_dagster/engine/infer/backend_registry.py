"""Backends from config: `{"type": "local", "model": ...}` or `{"type": "server", "base_url": ..., "model": ...}`.

A pipeline's judge and teacher, and the chat's model, are written as a model spec string or a mapping; each kind's
mapping is parsed by its pydantic model (`LocalBackendConfig`, `ServerBackendConfig`): unknown keys are named, not
ignored, and a server's key comes from the environment variable `api_key_env` names, never from a file.
Framework-free: nothing here imports Dagster.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .backend import Backend, BackendError
from .local_backend import LocalBackend
from .server_backend import ServerBackend


class _BackendConfig(BaseModel):
    # hide_input_in_errors: a server's api_key must not be echoed into an error, a log or MLflow
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)


class LocalBackendConfig(_BackendConfig):
    """A LocalBackend's settings (LocalBackend says what each does; an absent one keeps its default)."""

    model: str = Field(min_length=1)
    device: str = "auto"
    dtype: str = "auto"
    keep_loaded: int = 2
    batch_size: int = 8
    seed: int = 42


class ServerBackendConfig(_BackendConfig):
    """A ServerBackend's settings (ServerBackend says what each does; an absent one keeps its default)."""

    base_url: str = Field(min_length=1)
    model: str = Field(min_length=1)
    api_key: str | None = None
    api_key_env: str | None = None  # the environment variable holding the key
    headers: dict[str, str] | None = None
    timeout: float = 60
    retries: int = 3
    backoff: float = 0.5
    concurrency: int = 4


CONFIGS: dict[str, type[_BackendConfig]] = {"local": LocalBackendConfig, "server": ServerBackendConfig}


def _refusal(kind: str, config: type[_BackendConfig], exc: ValidationError) -> str:
    """A config's validation errors as one line: unknown keys first, then missing ones, then bad values."""
    errors = exc.errors()
    unknown = sorted(str(e["loc"][0]) for e in errors if e["type"] == "extra_forbidden")
    if unknown:
        return f"{kind} backend: unknown setting(s) {unknown}; known: {sorted(config.model_fields)}"
    missing = [str(e["loc"][0]) for e in errors if e["type"] in ("missing", "string_too_short")]
    if missing:
        return f"{kind} backend needs {', '.join(missing)}"
    return f"{kind} backend: " + "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors)


def backend_from_dict(d: dict) -> Backend:
    """A backend from config: {"type": "local", "model": ...} or {"type": "server", "base_url": ..., "model": ...}.
    Without "type", a "base_url" (or "url") means a server. Unknown keys are named, not ignored."""
    if not isinstance(d, dict):
        raise BackendError(f"a backend config must be a mapping, got {d!r:.200}")
    values = dict(d)
    if "url" in values and "base_url" not in values:
        values["base_url"] = values.pop("url")
    kind = values.pop("type", "server" if "base_url" in values else "local")
    config = CONFIGS.get(kind)
    if config is None:
        raise BackendError(f"backend type must be 'local' or 'server', got {kind!r}")
    try:
        parsed = config.model_validate(values)
    except ValidationError as exc:
        raise BackendError(_refusal(kind, config, exc)) from None
    settings: dict[str, Any] = parsed.model_dump(exclude_unset=True)  # an absent setting keeps its default
    if isinstance(parsed, LocalBackendConfig):
        return LocalBackend(**settings)
    name = settings.pop("api_key_env", None)
    if name:  # the key itself stays in the environment: never in a file, a log or MLflow
        if not os.environ.get(name):
            raise BackendError(
                f"server backend: api_key_env names {name}, which is not set in this process's environment"
            )
        settings["api_key"] = os.environ[name]
    return ServerBackend(**settings)


def as_backend(spec: Backend | dict | str) -> Backend:
    """A Backend as given, from a config mapping, or a LocalBackend for a model spec string."""
    if isinstance(spec, Backend):
        return spec
    if isinstance(spec, dict):
        return backend_from_dict(spec)
    if isinstance(spec, (str, Path)):
        return LocalBackend(str(spec))
    raise BackendError(f"a backend must be a Backend, a config mapping or a model spec, got {spec!r:.200}")
