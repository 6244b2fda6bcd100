"""A pipeline's tools, declared once, and the Toolset that runs them.

Two sources, which may be mixed (names must differ):
- `file`: a Python file beside the pipeline (relative to its folder). Its tools are the functions listed in an
  optional `TOOLS = [...]`, else every top-level function defined in the file whose name does not start with `_`.
  Each needs type hints and a Google-style docstring with an `Args:` line per argument: transformers'
  `get_json_schema` reads its schema from them, as TRL's GRPOTrainer(tools=...) does.
- `schemas`: tools written in the pipeline YAML, each {name, description, parameters (a JSON-schema object, each
  parameter with a type and a description), command (optional)}. A tool with `command` runs that argv, never
  through a shell, with its JSON arguments on stdin; its stdout is the result (engine/commands.py, as the command
  reward). Relative paths in the argv are the worker's working directory's, as for the command reward.

`Tools` is the settings model; `Tools.resolve(base_dir)` makes `file` absolute (and checks it is there), so the
settings serialize as plain JSON (`model_dump(mode="json")`: file, schemas, timeout, max_calls) that travel in a
job and are read back in the worker with `Tools.model_validate`; `Toolset.from_settings(tools, base_dir)` loads
them there.

How a call runs, and why: running.py (a forked child per Python call, killed at its time limit).

A call never raises: a tool that raises answers "error: <ExceptionType>: <message>", a call past the timeout
"error: timed out after <N>s", an unknown tool or arguments its schema refuses an "error: ..." too; each is
counted (`counts()`). `max_calls` bounds the calls of one conversation: the loop that drives the conversation
(TRL's, or the evaluation's) enforces it.
"""

from __future__ import annotations

import functools
import inspect
import json
import shutil
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from pydantic import Field, field_validator, model_validator

from ..config.job import ToolsInput
from ..config.settings import Settings
from ..source_files import run_file
from .calls import validate_arguments
from .running import run_function, run_tool_command

TOOL_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
JSON_TYPES = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list, "object": dict}


class ToolError(ValueError):
    """Tools that cannot be declared or loaded; the message names the file or tool and what is wrong."""


class ToolSchema(Settings):
    """One tool written in the pipeline YAML."""

    name: str = Field(pattern=TOOL_NAME, description="The name the model calls it by (a Python identifier).")
    description: str = Field(min_length=1, description="What the tool does; the model reads it.")
    parameters: dict[str, Any] = Field(
        default_factory=lambda: {"type": "object", "properties": {}},
        description="A JSON-schema object: properties, each with a type and a description, and required.",
    )
    command: list[str] | None = Field(
        None,
        min_length=1,
        description="The argv that answers a call, run directly (never through a shell): the JSON arguments on "
        "its stdin, its stdout the result. Without it the tool is declared only (rendered, validated).",
    )

    @field_validator("command", mode="before")
    @classmethod
    def _argv(cls, command: Any) -> Any:
        if isinstance(command, str):  # a string would need a shell to split it, and shells are never used
            raise ValueError(
                f"command must be a list of arguments (it is never run through a shell), e.g. {command.split()!r}"
            )
        return command

    @field_validator("parameters")
    @classmethod
    def _schema(cls, parameters: dict[str, Any]) -> dict[str, Any]:
        if parameters.get("type") != "object":
            raise ValueError("parameters must be a JSON schema with type: object")
        properties = parameters.get("properties", {})
        if not isinstance(properties, dict) or not all(isinstance(p, dict) for p in properties.values()):
            raise ValueError("parameters.properties must map each argument name to its JSON schema")
        try:
            Draft202012Validator.check_schema(parameters)
        except SchemaError as e:
            raise ValueError(f"parameters is not a valid JSON schema: {e.message}") from None
        for name, prop in properties.items():
            if not isinstance(prop.get("description"), str) or not prop["description"]:
                raise ValueError(f"parameter {name!r} needs a description (the model reads it)")
        unknown = [r for r in parameters.get("required", []) if r not in properties]
        if unknown:
            raise ValueError(f"parameters.required names {unknown}, which are not in its properties")
        return _canonical(parameters)

    def function(self) -> dict[str, Any]:
        """The chat-template schema: {"type": "function", "function": {name, description, parameters}}."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


class Tools(Settings):
    """The tools a pipeline declares: a Python file, schemas written in YAML, or both."""

    file: str | None = Field(
        None, description="A Python file of tool functions, relative to the pipeline's folder (see TOOLS = [...])."
    )
    schemas: list[ToolSchema] = Field(default_factory=list, description="Tools written here, by JSON schema.")
    timeout: float = Field(10.0, gt=0, allow_inf_nan=False, description="Seconds one call may take.")
    max_calls: int = Field(4, ge=1, description="The most tool calls in one conversation.")

    @model_validator(mode="after")
    def _some_tools(self) -> Tools:
        if not self.file and not self.schemas:
            raise ValueError("tools declares no tools: give file (a Python file of functions), schemas, or both")
        names = [s.name for s in self.schemas]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"tools names {twice} more than once")
        return self

    def resolve(self, base_dir: str | Path | None) -> Tools:
        """A copy whose file is absolute (read against base_dir, the pipeline's folder), after checking it exists."""
        if not self.file:
            return self
        path = Path(self.file).expanduser()
        if not path.is_absolute() and base_dir is not None:
            path = Path(base_dir) / path
        if not path.is_file():
            raise ToolError(f"tools file {str(path)!r} does not exist")
        return self.model_copy(update={"file": str(path.resolve())})

    def to_input(self, folder: Path) -> ToolsInput:
        """The tools as a job carries them, the file copied into folder (an artifact's): the job is
        self-contained, and the artifact keeps the tools its model was trained with."""
        file = None
        if self.file:
            source = Path(self.resolve(None).file)
            folder.mkdir(parents=True, exist_ok=True)
            file = str(folder / source.name)
            shutil.copyfile(source, file)
        return ToolsInput(
            file=file,
            schemas=[s.model_dump(mode="json") for s in self.schemas],
            timeout=self.timeout,
            max_calls=self.max_calls,
        )


@dataclass(frozen=True)
class ToolResult:
    """What a call answered: the text for the model, and whether it was an error or a timeout."""

    name: str
    content: str
    status: Literal["ok", "error", "timeout"] = "ok"

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass(frozen=True)
class _Tool:
    name: str
    schema: dict[str, Any]  # {"type": "function", "function": {...}}
    function: Callable | None = None  # a Python tool
    command: tuple[str, ...] | None = None  # a YAML tool with a command


class Toolset:
    """The tools of a pipeline, ready to render (`schemas`), hand to TRL (`callables()`) and run (`call`)."""

    def __init__(self, tools: Sequence[_Tool], timeout: float = 10.0, max_calls: int = 4):
        self._tools = {t.name: t for t in tools}
        if len(self._tools) != len(tools):
            names = [t.name for t in tools]
            raise ToolError(f"tools named more than once: {sorted({n for n in names if names.count(n) > 1})}")
        self.timeout = float(timeout)
        self.max_calls = int(max_calls)
        self._counts = {"calls": 0, "errors": 0, "timeouts": 0}
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Tools, base_dir: str | Path | None = None) -> Toolset:
        """The toolset a pipeline's Tools declare; a relative file is read against base_dir (its folder)."""
        settings = settings.resolve(base_dir)
        tools = [_Tool(s.name, s.function(), command=tuple(s.command) if s.command else None) for s in settings.schemas]
        if settings.file:
            tools = [*load_file_tools(Path(settings.file)), *tools]
        return cls(tools, settings.timeout, settings.max_calls)

    @classmethod
    def from_input(cls, tools: ToolsInput | None) -> Toolset | None:
        """The toolset a job's tools describe (None when the pipeline declares none)."""
        if tools is None:
            return None
        return cls.from_settings(Tools.model_validate(tools.model_dump(mode="json")))

    @property
    def schemas(self) -> list[dict[str, Any]]:
        """The chat-template schemas, {"type": "function", "function": {...}} each, in declaration order."""
        return [json.loads(json.dumps(t.schema)) for t in self._tools.values()]  # a copy the caller may change

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    def counts(self) -> dict[str, int]:
        """Calls so far, and how many answered an error or timed out."""
        with self._lock:
            return dict(self._counts)

    def call(self, name: str, arguments: Mapping[str, Any] | str | None = None) -> ToolResult:
        """Run one call (arguments as a mapping or a JSON string); never raises (see the module's docstring)."""
        self._count("calls")
        tool = self._tools.get(name)
        if tool is None:
            return self._error(name, f"unknown tool {name!r} (tools: {', '.join(self._tools) or 'none'})")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError as e:
                return self._error(name, f"arguments are not valid JSON ({e})")
        arguments = {} if arguments is None else arguments
        problems = validate_arguments(tool.schema["function"].get("parameters") or {}, arguments)
        if problems:
            return self._error(name, "invalid arguments: " + "; ".join(problems))
        if tool.function is not None:
            status, text = run_function(tool.function, dict(arguments), self.timeout)
        elif tool.command is not None:
            status, text = run_tool_command(tool.command, dict(arguments), self.timeout)
        else:
            return self._error(name, f"tool {name!r} is declared without a command, so it cannot run")
        if status == "timeout":
            self._count("timeouts")
            return ToolResult(name, f"error: timed out after {self.timeout:g}s", "timeout")
        if status == "error":
            return self._error(name, text)
        return ToolResult(name, text)

    def callables(self) -> list[Callable]:
        """Every tool as a Python function for TRL's GRPOTrainer(tools=...): each call goes through `call` (the
        timeout, the counts) and returns its text. A Python tool's wrapper keeps its schema (functools.wraps); a
        YAML tool becomes a function whose signature and docstring give get_json_schema its schema back, which
        needs flat parameters (types, descriptions, enums): otherwise a ToolError, as TRL would show the model a
        different schema than the one rendered elsewhere."""
        return [self._callable(t) for t in self._tools.values()]

    def _callable(self, tool: _Tool) -> Callable:
        if tool.function is not None:
            signature = inspect.signature(tool.function)

            @functools.wraps(tool.function)
            def wrapper(*args, **kwargs):
                try:
                    arguments = dict(signature.bind_partial(*args, **kwargs).arguments)
                except TypeError:  # an unknown keyword: `call` answers it as an invalid argument
                    arguments = kwargs
                return self.call(tool.name, arguments).content

            return wrapper
        return _schema_function(tool, lambda **kwargs: self.call(tool.name, kwargs).content)

    def _count(self, what: str) -> None:
        with self._lock:
            self._counts[what] += 1

    def _error(self, name: str, message: str) -> ToolResult:
        self._count("errors")
        return ToolResult(name, f"error: {message}", "error")


# -- loading a tools file -------------------------------------------------------------------------------------------


def with_tools(rows: list[dict], schemas: list[dict]) -> list[dict]:
    """rows (chat rows, in place) with the pipeline's tool schemas wherever a row has none of its own: the
    chat template renders them in each conversation's system turn, in training as in chat."""
    for row in rows:
        if not row.get("tools"):
            row["tools"] = schemas
    return rows


def load_file_tools(path: Path) -> list[_Tool]:
    """The tools a Python file declares (TOOLS = [...], else its public top-level functions), with schemas."""
    module = _load_module(path)
    listed = getattr(module, "TOOLS", None)
    if listed is not None:
        if not isinstance(listed, (list, tuple)) or not all(inspect.isfunction(f) for f in listed):
            raise ToolError(f"{path}: TOOLS must be a list of functions, got {listed!r}")
        functions = list(listed)
    else:
        functions = [
            f
            for name, f in vars(module).items()
            if inspect.isfunction(f) and f.__module__ == module.__name__ and not name.startswith("_")
        ]
    if not functions:
        raise ToolError(f"{path} defines no tools: no public top-level function and no TOOLS = [...]")
    return [_function_tool(f, str(path)) for f in functions]


def _load_module(path: Path):
    if not path.is_file():
        raise ToolError(f"tools file {str(path)!r} does not exist")
    try:
        return run_file(path, "dragon_tools")
    except BaseException as e:  # noqa: BLE001 - a SystemExit at import time is the file's error too
        raise ToolError(f"loading tools file {path} failed: {type(e).__name__}: {e}") from e


def _function_tool(function: Callable, where: str) -> _Tool:
    from transformers.utils import DocstringParsingException, TypeHintParsingException, get_json_schema

    name = getattr(function, "__name__", repr(function))
    try:
        schema = get_json_schema(function)
    except (DocstringParsingException, TypeHintParsingException) as e:
        missing = "its docstring" if isinstance(e, DocstringParsingException) else "its type hints"
        raise ToolError(
            f"{where}: tool {name}() cannot be declared, {missing} fall short: {e}. A tool needs a type hint on "
            "every argument and a Google-style docstring: a description, then an Args: section with one "
            "'name: description' line per argument"
        ) from e
    return _Tool(name, schema, function=function)


# -- YAML schemas as functions --------------------------------------------------------------------------------------


def _canonical(parameters: dict[str, Any]) -> dict[str, Any]:
    """parameters in the key order get_json_schema writes (type, properties, required; each property's type
    first and description last), so a YAML tool renders as its function for TRL does."""
    properties = {
        name: {
            **({"type": prop["type"]} if "type" in prop else {}),
            **{k: v for k, v in prop.items() if k not in ("type", "description")},
            "description": prop["description"],
        }
        for name, prop in parameters.get("properties", {}).items()
    }
    out: dict[str, Any] = {"type": "object", "properties": properties}
    required = [name for name in properties if name in parameters.get("required", [])]
    if required:
        out["required"] = required
    out.update({k: v for k, v in parameters.items() if k not in ("type", "properties", "required")})
    return out


def _schema_function(tool: _Tool, run: Callable[..., str]) -> Callable:
    """A function named tool.name whose signature and docstring get_json_schema reads as tool.schema."""
    from transformers.utils import get_json_schema

    function = tool.schema["function"]
    parameters = function.get("parameters") or {}
    required = set(parameters.get("required", []))
    signature, annotations, lines = [], {}, []
    for name, prop in parameters.get("properties", {}).items():
        kind = prop.get("type")
        hint = JSON_TYPES.get(kind, object) if isinstance(kind, str) else object  # object: get_json_schema refuses
        default = inspect.Parameter.empty if name in required else None
        signature.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=hint))
        annotations[name] = hint
        choices = f" (choices: {json.dumps(prop['enum'])})" if "enum" in prop else ""
        lines.append(f"    {name}: {prop.get('description', '')}{choices}")

    def tool_function(**kwargs):
        return run(**kwargs)

    tool_function.__name__ = tool_function.__qualname__ = tool.name
    tool_function.__doc__ = function["description"] + ("\n\nArgs:\n" + "\n".join(lines) if lines else "")
    tool_function.__signature__ = inspect.Signature(signature)
    tool_function.__annotations__ = annotations
    try:
        same = get_json_schema(tool_function) == tool.schema
    except Exception:  # noqa: BLE001 - a schema get_json_schema cannot even read is not the same schema
        same = False
    if not same:
        raise ToolError(
            f"tool {tool.name!r}: TRL reads a tool's schema from a Python function, and this schema has parts a "
            "signature cannot express (nested items, additionalProperties, a type that is not one of string, "
            "integer, number, boolean, array, object...): keep its parameters flat to train with it in GRPO"
        )
    return tool_function
