"""What every settings model shares: unknown keys are errors, and how a run's values go over a stage's.

Numbers written in YAML as `2e-4` arrive as strings (PyYAML follows YAML 1.1); pydantic's lax mode reads them
as numbers, so they are accepted wherever a number is expected.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict

NAME_PATTERN = r"^[a-z][a-z0-9_]*$"


class Settings(BaseModel):
    """Unknown keys are errors: a typo in YAML must not silently fall back to a default."""

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)  # no key echoed into a log


def no_inline_secret(backend: str | dict[str, Any]) -> str | dict[str, Any]:
    """A key written in the pipeline would be kept in job files, manifests and MLflow params: refuse it."""
    if isinstance(backend, dict):
        headers = backend.get("headers") or {}
        if "api_key" in backend or any(str(h).lower() in ("authorization", "api-key", "x-api-key") for h in headers):
            raise ValueError(
                "do not write an API key in the pipeline (it would be kept in job files, manifests "
                "and MLflow): put it in an environment variable and name that, e.g. "
                "api_key_env: OPENAI_API_KEY"
            )
    return backend


# "reference", a model name or directory, or a server {base_url, model, api_key_env, timeout, ...}
Backend = Annotated[str | dict[str, Any], AfterValidator(no_inline_secret)]


def overlay(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """base with top's values put in, nested mappings merged key by key (a profile over a stage, say)."""
    out = dict(base)
    for key, value in top.items():
        out[key] = overlay(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def value_at(settings: BaseModel, path: str) -> Any:
    """The value of a setting by its path of fields (`args.learning_rate`), None where it has none: in a settings
    model, or in settings recorded without their kind's model (nested values then as written)."""
    value: Any = settings
    for part in path.split("."):
        if isinstance(value, BaseModel):
            value = getattr(value, part, None)
        elif isinstance(value, dict):
            value = value.get(part)
        else:
            return None
    return value


def tunable_fields(model: type[Settings]) -> dict[str, Any]:
    """Fields that can change per run (the launchpad, profiles): numbers, switches, choices and nested settings.
    Names, templates, file paths and backends are the pipeline's structure and stay in its YAML."""
    return {
        name: info.annotation
        for name, info in model.model_fields.items()
        if name != "kind" and _tunable(info.annotation)
    }


def _tunable(annotation: Any) -> bool:
    if annotation in (int, float, bool) or get_origin(annotation) is Literal:
        return True
    if isinstance(annotation, type) and issubclass(annotation, Settings):
        return True
    options = get_args(annotation) if get_origin(annotation) is not None else ()
    return len(options) == 2 and type(None) in options and {*options} - {type(None)} <= {int, float, bool}
