"""What every settings model shares: unknown keys are errors, and how a run's values go over a stage's.

Numbers written in YAML as `2e-4` arrive as strings (PyYAML follows YAML 1.1); pydantic's lax mode reads them
as numbers, so they are accepted wherever a number is expected.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, TypeVar, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict
from pydantic.fields import FieldInfo

NAME_PATTERN = r"^[a-z][a-z0-9_]*$"
S = TypeVar("S", bound=BaseModel)


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


def with_values(settings: S, values: Mapping[str, Any]) -> S:
    """settings with a run's values put in (a mapping under a nested settings field goes into that model), checked
    by its model. The fields not given keep their values as they are, typed: nothing goes through a dict and
    back. An unknown key or a bad value is the model's ValidationError, located from the top (args.max_steps)."""
    return type(settings).model_validate(_updated(settings, values))


def _updated(settings: BaseModel, values: Mapping[str, Any]) -> dict[str, Any]:
    """The fields set on settings with values put in, each kept value the object it is; a nested settings model
    given values becomes the same (validated with the whole, so an error names its path)."""
    out = {name: getattr(settings, name) for name in settings.model_fields_set}
    for name, value in values.items():
        current = getattr(settings, name, None) if name in type(settings).model_fields else None
        nested = isinstance(current, Settings) and isinstance(value, Mapping)
        out[name] = _updated(current, value) if nested else value
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


def field_at(model: type[BaseModel], path: str) -> FieldInfo | None:
    """The field a path of fields (`args.learning_rate`) names in a settings model; None where it names none."""
    info = None
    for part in path.split("."):
        if info is not None:
            options = get_args(info.annotation) or (info.annotation,)
            nested = [o for o in options if isinstance(o, type) and issubclass(o, BaseModel)]
            if len(nested) != 1:
                return None
            model = nested[0]
        info = model.model_fields.get(part)
        if info is None:
            return None
    return info


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
