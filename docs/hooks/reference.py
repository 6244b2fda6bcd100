"""The reference pages, generated from the code when the site is built, so they cannot drift from it.

A page marks where a reference goes with an HTML comment, `<!-- reference: NAME -->`; this mkdocs hook
(mkdocs.yml `hooks:`) puts the generated Markdown there:
- stages: every stage kind in the catalog, its summary, its settings model's fields (type, default, description),
  nested settings (lora, args) as tables of their own;
- rewards: every reward type, its family and options;
- pipeline: the pipeline's top-level fields, its datasets, and the feedback retraining's settings and gate;
- resources: the training resource (hardware and speed fields generated from the engine's models, launchers),
  the artifact store, MLflow tracking and the k8s pod settings;
- cli: every `dragon` command with its arguments and options, from click.
"""

from __future__ import annotations

import enum
import re
import types
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

MARKER = re.compile(r"<!--\s*reference:\s*(\w+)\s*-->")


def on_page_markdown(markdown: str, page, config, files) -> str:
    return MARKER.sub(lambda m: GENERATORS[m.group(1)](), markdown)


# ------------------------------------------------------------------------------------------------ fields


def type_name(annotation: Any) -> str:
    origin, args = get_origin(annotation), get_args(annotation)
    if annotation is type(None):
        return "null"
    if origin is Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin in (Union, types.UnionType):
        return " or ".join(type_name(a) for a in args)
    if origin is list:
        return f"list of {type_name(args[0])}" if args else "list"
    if origin is dict:
        return f"mapping of {type_name(args[1])}" if len(args) == 2 else "mapping"
    if origin is not None and getattr(origin, "__name__", "") == "Annotated":
        return type_name(args[0])
    if hasattr(annotation, "__metadata__"):  # Annotated
        return type_name(args[0]) if args else str(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"[{annotation.__name__}](#{anchor(annotation.__name__)})"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " \\| ".join(f"`{m.value}`" for m in annotation)
    return getattr(annotation, "__name__", str(annotation)).replace("|", "\\|")


def default_of(info) -> str:
    if info.default is PydanticUndefined and info.default_factory is None:
        return "required"
    value = info.default_factory() if info.default_factory is not None else info.default
    if isinstance(value, BaseModel):
        return "see below"
    if value is None:
        return "null"
    return f"`{value!r}`" if not isinstance(value, str) else f"`{value}`" if value else '`""`'


def anchor(name: str) -> str:
    """The id Python-Markdown's toc gives a heading of this text (word characters and hyphens kept)."""
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", name.lower())).strip("-")


def nested_models(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for a in get_args(annotation) for m in nested_models(a)]


def fields_table(model: type[BaseModel], skip: tuple[str, ...] = ()) -> list[str]:
    lines = ["| setting | type | default | what it does |", "|---|---|---|---|"]
    for name, info in model.model_fields.items():
        if name in skip:
            continue
        description = (info.description or "").replace("|", "\\|").replace("\n", " ")
        lines.append(f"| `{name}` | {type_name(info.annotation)} | {default_of(info)} | {description} |")
    return lines


def model_section(
    model: type[BaseModel], title: str, level: int = 3, skip: tuple[str, ...] = (), seen: set | None = None
) -> list[str]:
    """A model's docstring and fields, then each nested settings model once, as a section of its own."""
    seen = set() if seen is None else seen
    lines = [f"{'#' * level} {title}", ""]
    doc = " ".join((model.__doc__ or "").split())
    if doc:
        lines += [doc, ""]
    lines += fields_table(model, skip) + [""]
    for info in model.model_fields.values():
        for nested in nested_models(info.annotation):
            if nested not in seen and nested.__module__.startswith("dragon_dagster"):
                seen.add(nested)
                lines += model_section(nested, nested.__name__, level + 1, seen=seen)
    return lines


# ------------------------------------------------------------------------------------------------ pages


def stages() -> str:
    from dragon_dagster.engine import catalog

    lines = []
    by_role: dict[str, list] = {}
    for kind in catalog.KINDS.values():
        by_role.setdefault(kind.role, []).append(kind)
    lines += ["| kind | role | what it makes |", "|---|---|---|"]
    lines += [f"| [`{k.name}`](#{anchor(k.name)}) | {k.role} | {k.summary} |" for k in catalog.KINDS.values()]
    lines.append("")
    seen: set = set()
    for role, kinds in by_role.items():
        for kind in kinds:
            lines += [f"## {kind.name}", "", f"Role: **{role}**. {kind.summary}", ""]
            continues = getattr(kind.settings, "continues", "never")
            if continues != "never":
                lines += [f"Continues from the training stage before it: {continues}.", ""]
            checks = [c.name for c in kind.checks(example_stage(kind))]
            if checks:
                lines += ["Asset checks: " + ", ".join(f"`{c}`" for c in checks) + ".", ""]
            body = model_section(kind.settings, f"`{kind.name}` settings", 3, seen=seen)
            lines += body[2:] if len(body) > 2 else body
    return "\n".join(lines)


def example_stage(kind):
    """The smallest valid stage of a kind, to ask which checks it gets (checks may depend on settings)."""
    fields = {"name": "x", "kind": kind.name}
    for name, info in kind.settings.model_fields.items():
        if info.is_required() and name not in fields:
            fields[name] = EXAMPLE_VALUES.get(name, "x")
    try:
        return kind.settings.model_validate(fields)
    except Exception:  # noqa: BLE001 - a kind whose minimal stage cannot be guessed: its checks stay unnamed
        return kind.settings.model_construct(**fields)


EXAMPLE_VALUES = {
    "rewards": [{"type": "exact"}],
    "path": "x.csv",
    "prompt": "p",
    "response": "r",
    "chosen": "c",
    "rejected": "r",
    "reply": "r",
    "label": "l",
    "teacher": "reference",
}


def rewards() -> str:
    from dragon_dagster.engine.rewards import REWARD_TYPES

    lines = ["| type | family | compares with the row's reference |", "|---|---|---|"]
    lines += [
        f"| [`{name}`](#{anchor(name)}) | {model.family} | {'yes' if model.needs_reference else 'no'} |"
        for name, model in REWARD_TYPES.items()
    ]
    lines.append("")
    for name, model in REWARD_TYPES.items():
        lines += [f"## {name}", ""]
        doc = " ".join((model.__doc__ or "").split())
        if doc:
            lines += [doc, ""]
        lines += fields_table(model, skip=("type",)) + [""]
    return "\n".join(lines)


def pipeline() -> str:
    from dragon_dagster.engine.pipeline import Pipeline
    from dragon_dagster.engine.pipeline.retraining import Feedback
    from dragon_dagster.engine.pipeline.sweeps import Sweep

    lines = model_section(Pipeline, "Pipeline", 2, skip=())
    lines += model_section(Sweep, "Sweep", 2)
    lines += model_section(Feedback, "Feedback retraining", 2)
    return "\n".join(lines)


def resources() -> str:
    from dragon_dagster.resources import ArtifactStore, MLflowTracking, TrainingResource

    lines = []
    for model in (TrainingResource, ArtifactStore, MLflowTracking):
        lines += model_section(model, f"`{model.__name__}`", 2)
    return "\n".join(lines)


def cli() -> str:
    import click

    from dragon_dagster.cli import main

    lines = []
    with click.Context(main, info_name="dragon") as ctx:
        for name in main.list_commands(ctx):
            command = main.get_command(ctx, name)
            lines += [f"## `dragon {name}`", ""]
            usage = " ".join(command.collect_usage_pieces(ctx))
            lines += ["```", f"dragon {name} {usage}".rstrip(), "```", ""]
            help_text = (command.help or "").strip()
            if help_text:
                lines += [help_text.split("\f")[0], ""]
            params = [p for p in command.params if p.name != "help"]
            if params:
                lines += ["| argument or option | what it does |", "|---|---|"]
                for p in params:
                    names = (
                        ", ".join(f"`{o}`" for o in getattr(p, "opts", [p.name]))
                        if isinstance(p, click.Option)
                        else f"`{p.name.upper()}`"
                    )
                    what = (getattr(p, "help", None) or "").replace("|", "\\|").replace("\n", " ")
                    if isinstance(p, click.Option) and p.default not in (None, False, ()) and not p.is_flag:
                        what += f" (default: `{p.default}`)"
                    lines.append(f"| {names} | {what} |")
                lines.append("")
    return "\n".join(lines)


GENERATORS = {"stages": stages, "rewards": rewards, "pipeline": pipeline, "resources": resources, "cli": cli}
