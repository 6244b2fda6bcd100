"""Declaring tools (a Python file, YAML schemas) and running them: schemas, clear errors, the time limit, counts."""

from __future__ import annotations

import os
import sys
import textwrap
import time
from pathlib import Path

import pytest
from pydantic import ValidationError
from transformers.utils import get_json_schema

from dragon_dagster.engine.tools.declare import ToolError, Tools, Toolset

PY = sys.executable

TOOLS_FILE = '''
from __future__ import annotations

import os
import time


def add(a: int, b: int = 1) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    print("prints do not become the result")
    return a + b


def fail(reason: str) -> str:
    """Always fails.

    Args:
        reason: Why it fails.
    """
    raise ValueError(f"failed because {reason}")


def sleep(seconds: float) -> str:
    """Sleeps, then answers.

    Args:
        seconds: How long to sleep.
    """
    time.sleep(seconds)
    return "awake"


def spawn_and_sleep(pid_file: str) -> str:
    """Starts a grandchild that writes its pid, then sleeps.

    Args:
        pid_file: Where the grandchild writes its pid.
    """
    if os.fork() == 0:
        with open(pid_file, "w") as f:
            f.write(str(os.getpid()))
        time.sleep(60)
        os._exit(0)
    time.sleep(60)
    return "never"


def stop_the_process() -> str:
    """Exits the process running it."""
    os._exit(3)


def _helper():
    return "not a tool"
'''


def write(path: Path, source: str) -> Path:
    path.write_text(textwrap.dedent(source))
    return path


@pytest.fixture
def toolset(tmp_path) -> Toolset:
    write(tmp_path / "tools.py", TOOLS_FILE)
    return Toolset.from_settings(Tools(file="tools.py", timeout=1), base_dir=tmp_path)


ECHO = {
    "name": "shout",
    "description": "Upper-cases a text.",
    "parameters": {
        "type": "object",
        "properties": {
            "text": {"description": "The text.", "type": "string"},
            "times": {"type": "integer", "description": "How many times."},
            "style": {"enum": ["plain", "bold"], "type": "string", "description": "How it looks."},
        },
        "required": ["times", "text"],
    },
    "command": [PY, "-c", "import json, sys; a = json.load(sys.stdin); print(a['text'].upper() * a['times'])"],
}


# -- declaring ------------------------------------------------------------------------------------------------------


def test_a_typed_documented_function_becomes_a_tool_with_its_schema(toolset):
    assert toolset.names == ["add", "fail", "sleep", "spawn_and_sleep", "stop_the_process"]  # not _helper
    add = toolset.schemas[0]
    assert add == {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"type": "integer", "description": "The first number."},
                    "b": {"type": "integer", "description": "The second number."},
                },
                "required": ["a"],
            },
            "return": {"type": "integer"},
        },
    }


def test_a_tools_list_picks_the_tools(tmp_path):
    write(
        tmp_path / "tools.py",
        '''
        def one(x: str) -> str:
            """One.

            Args:
                x: A text.
            """
            return x


        def two() -> str:
            """Two."""
            return "2"


        TOOLS = [two]
        ''',
    )
    assert Toolset.from_settings(Tools(file="tools.py"), tmp_path).names == ["two"]


@pytest.mark.parametrize(
    ("source", "missing"),
    [
        ('def lookup(city):\n    """Look up.\n\n    Args:\n        city: A city.\n    """\n', "type hints"),
        ("def lookup(city: str):\n    return city\n", "docstring"),
        ('def lookup(city: str):\n    """Look up, no Args section."""\n', "docstring"),
    ],
)
def test_a_function_without_hints_or_docstring_is_a_clear_error(tmp_path, source, missing):
    path = write(tmp_path / "my_tools.py", source)
    with pytest.raises(ToolError) as error:
        Toolset.from_settings(Tools(file="my_tools.py"), tmp_path)
    message = str(error.value)
    assert str(path) in message and "lookup()" in message and f"{missing} fall short" in message


def test_a_file_that_raises_on_import_is_an_error_naming_it(tmp_path):
    path = write(tmp_path / "broken.py", "import no_such_module_xyz\n")
    with pytest.raises(ToolError, match=f"loading tools file {path} failed: ModuleNotFoundError"):
        Toolset.from_settings(Tools(file="broken.py"), tmp_path)


def test_a_missing_file_or_one_without_tools_is_an_error(tmp_path):
    with pytest.raises(ToolError, match="does not exist"):
        Tools(file="nowhere.py").resolve(tmp_path)
    write(tmp_path / "empty.py", "X = 1\n")
    with pytest.raises(ToolError, match="defines no tools"):
        Toolset.from_settings(Tools(file="empty.py"), tmp_path)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"parameters": {"type": "array"}}, "type: object"),
        ({"parameters": {"type": "object", "properties": {"x": {"type": "text", "description": "X."}}}}, "valid JSON"),
        ({"parameters": {"type": "object", "properties": {"x": {"type": "string"}}}}, "needs a description"),
        ({"parameters": {"type": "object", "properties": {}, "required": ["x"]}}, "not in its properties"),
        ({"command": "python tool.py"}, "never run through a shell"),
        ({"name": "two words"}, "should match pattern"),
        ({"description": ""}, "at least 1 character"),
        ({"extra": 1}, "Extra inputs are not permitted"),
    ],
)
def test_a_malformed_yaml_schema_is_refused(change, message):
    with pytest.raises(ValidationError, match=message):
        Tools(schemas=[{**ECHO, **change}])


def test_settings_need_tools_and_distinct_names():
    with pytest.raises(ValidationError, match="declares no tools"):
        Tools()
    with pytest.raises(ValidationError, match="more than once"):
        Tools(schemas=[ECHO, ECHO])


def test_settings_serialize_with_an_absolute_file_that_a_worker_reads_back(tmp_path):
    write(tmp_path / "tools.py", TOOLS_FILE)
    resolved = Tools(file="tools.py", schemas=[ECHO], timeout=3, max_calls=2).resolve(tmp_path)
    dumped = resolved.model_dump(mode="json")
    assert dumped["file"] == str((tmp_path / "tools.py").resolve())
    elsewhere = Toolset.from_settings(Tools.model_validate(dumped), base_dir=None)  # a worker, another cwd
    assert elsewhere.names[-1] == "shout" and "add" in elsewhere.names
    assert (elsewhere.timeout, elsewhere.max_calls) == (3.0, 2)


def test_a_yaml_schema_is_rendered_in_get_json_schema_order():
    toolset = Toolset.from_settings(Tools(schemas=[ECHO]))
    function = toolset.schemas[0]["function"]
    assert list(function["parameters"]) == ["type", "properties", "required"]
    assert function["parameters"]["required"] == ["text", "times"]  # the properties' order
    assert list(function["parameters"]["properties"]["style"]) == ["type", "enum", "description"]


# -- running ----------------------------------------------------------------------------------------------------------


def test_a_call_answers_the_return_value_as_text(toolset):
    result = toolset.call("add", {"a": 2, "b": 3})
    assert (result.content, result.status, result.ok) == ("5", "ok", True)
    assert toolset.call("add", '{"a": 2}').content == "3"  # arguments as JSON text, a default used
    assert toolset.counts() == {"calls": 2, "errors": 0, "timeouts": 0}


def test_a_tool_that_raises_answers_an_error_and_is_counted(toolset):
    result = toolset.call("fail", {"reason": "the test"})
    assert result.content == "error: ValueError: failed because the test" and result.status == "error"
    assert toolset.counts() == {"calls": 1, "errors": 1, "timeouts": 0}


def test_a_tool_that_ends_its_process_answers_an_error(toolset):
    result = toolset.call("stop_the_process", {})
    assert result.status == "error" and "exit code 3" in result.content


def test_a_slow_tool_times_out_within_the_limit_and_is_counted(toolset):
    started = time.monotonic()
    result = toolset.call("sleep", {"seconds": 30})
    assert time.monotonic() - started < 1 + 1.0
    assert result.content == "error: timed out after 1s" and result.status == "timeout"
    assert toolset.counts() == {"calls": 1, "errors": 0, "timeouts": 1}
    assert toolset.call("sleep", {"seconds": 0}).content == "awake"  # the toolset still works after


def test_a_timeout_also_ends_what_the_tool_started(toolset, tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    assert toolset.call("spawn_and_sleep", {"pid_file": str(pid_file)}).status == "timeout"
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.05)
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")  # a zombie waiting for init counts as gone
    return not (stat.exists() and stat.read_text().split(") ")[1].startswith("Z"))


def test_unknown_tools_and_invalid_arguments_answer_errors_without_running(toolset):
    assert toolset.call("nope", {}).content == (
        "error: unknown tool 'nope' (tools: add, fail, sleep, spawn_and_sleep, stop_the_process)"
    )
    wrong = toolset.call("add", {"a": "two", "c": 1})
    assert wrong.status == "error" and "'two' is not of type 'integer'" in wrong.content
    assert "'c' was unexpected" in wrong.content
    assert toolset.call("add", "{not json").content.startswith("error: arguments are not valid JSON")
    assert toolset.counts() == {"calls": 3, "errors": 3, "timeouts": 0}


def test_a_yaml_command_tool_reads_json_on_stdin_without_a_shell(tmp_path):
    marker = tmp_path / "injected"
    toolset = Toolset.from_settings(Tools(schemas=[ECHO]))
    text = f"hi; touch {marker}"  # a shell would run the touch
    assert toolset.call("shout", {"text": text, "times": 2}).content == text.upper() * 2
    assert not marker.exists()


def test_a_failing_or_slow_command_tool_answers_errors():
    failing = {**ECHO, "name": "fails", "command": [PY, "-c", "print('bad input'); raise SystemExit(2)"]}
    slow = {**ECHO, "name": "slow", "command": [PY, "-c", "import time; time.sleep(30)"]}
    missing = {**ECHO, "name": "missing", "command": ["no-such-command-xyz"]}
    toolset = Toolset.from_settings(Tools(schemas=[failing, slow, missing], timeout=1))
    arguments = {"text": "x", "times": 1}
    assert toolset.call("fails", arguments).content == "error: command exited with code 2: bad input"
    started = time.monotonic()
    assert toolset.call("slow", arguments).content == "error: timed out after 1s"
    assert time.monotonic() - started < 2
    assert toolset.call("missing", arguments).content.startswith("error: FileNotFoundError: cannot run")
    declared_only = Toolset.from_settings(Tools(schemas=[{k: v for k, v in ECHO.items() if k != "command"}]))
    assert "without a command" in declared_only.call("shout", arguments).content
    assert toolset.counts() == {"calls": 3, "errors": 2, "timeouts": 1}


# -- for TRL ----------------------------------------------------------------------------------------------------------


def test_callables_keep_the_schema_and_run_through_the_toolset(toolset, tmp_path):
    from importlib import import_module

    callables = {c.__name__: c for c in toolset.callables()}
    module = import_module(toolset._tools["add"].function.__module__)
    for name in toolset.names:
        assert get_json_schema(callables[name]) == get_json_schema(getattr(module, name))
    assert callables["add"](a=4, b=5) == "9"
    assert callables["fail"](reason="x") == "error: ValueError: failed because x"  # never raises into TRL
    assert callables["add"](a=1, z=2).startswith("error: invalid arguments")
    assert toolset.counts() == {"calls": 3, "errors": 2, "timeouts": 0}


def test_a_flat_yaml_tool_becomes_a_callable_with_the_same_schema():
    toolset = Toolset.from_settings(Tools(schemas=[ECHO]))
    (shout,) = toolset.callables()
    assert shout.__name__ == "shout"
    assert get_json_schema(shout) == toolset.schemas[0]
    assert shout(text="a", times=3) == "AAA"


def test_a_nested_yaml_tool_cannot_become_a_callable():
    nested = {
        "name": "tag",
        "description": "Tags things.",
        "parameters": {
            "type": "object",
            "properties": {"tags": {"type": "array", "items": {"type": "string"}, "description": "The tags."}},
        },
    }
    toolset = Toolset.from_settings(Tools(schemas=[nested]))
    assert toolset.call("tag", {"tags": [1]}).status == "error"  # validated against the items' type
    with pytest.raises(ToolError, match="'tag'.*keep its parameters flat"):
        toolset.callables()
