"""The tool parts of a chat template as fixed text, so the Ollama TEMPLATE can render tools as training did.

chat_template.py finds the text around each plain message; this finds, the same way (rendering the template
with sentinel contents, tool names and arguments, and reading what lies between them), the text around the
parts a conversation with tools adds:

- the tool schemas, written into the system turn (or, without a system message, into the system turn the
  template opens on its own): text before the first schema, between schemas, after the last;
- an assistant turn's calls: text between its content and the first call, between calls, and around each call's
  name and JSON arguments;
- tool results: the text that opens a run of tool turns, goes between two of them, and closes the run.

Each schema must be written as JSON (`tool | tojson`) and each call's arguments as a JSON object: Ollama writes
them with its own JSON (`{{ .Function }}`, `{{ .Function.Arguments }}`), compact and in its own key order, so the
Modelfile shows the model the same parts with JSON spelled a little differently from training. `derive_tools`
then checks that composing the pieces (`render`, what the Ollama template writes) reproduces the template on
conversations with tools, calls and results, and refuses a template that does anything else, with the reason:
the Modelfile then carries no tool support (the fallback format of tools/template.py, which merged models of a
pipeline with tools carry, passes).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from .chat_template import SENTINEL, Segments
from .errors import ExportError


@dataclass(frozen=True)
class ToolSegments:
    tools_prefix: str  # after the system content, before the first schema
    tool_separator: str  # between two schemas
    tools_suffix: str  # after the last schema (the system suffix follows)
    start_tools_without_system: str  # at the start, with tools and no system message (before tools_prefix)
    call_after_content: str  # between an assistant turn's content and its first call (when it has content)
    call_separator: str  # between two calls
    call_open: str  # before a call's name
    call_middle: str  # between a call's name and its arguments
    call_close: str  # after a call's arguments
    results_open: str  # before the first of consecutive tool turns
    results_between: str  # between two consecutive tool turns
    results_close: str  # after the last of consecutive tool turns

    def as_dict(self) -> dict:
        return asdict(self)


def _schema(tool: dict) -> str:
    return json.dumps(tool, ensure_ascii=False)  # what the template's tojson writes


def _call(name: str, arguments: dict) -> dict:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def _probe(name: str) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": "A probe.",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    }


TOOLS = [_probe("dragon_probe_one"), _probe("dragon_probe_two")]
S, U, C, R1, R2, U2 = (SENTINEL.format(k) for k in ("SYSTEM", "USER", "CONTENT", "RESULT1", "RESULT2", "USER2"))
A1, A2 = {"q": SENTINEL.format("ARG1")}, {"q": SENTINEL.format("ARG2")}
N1, N2 = "dragon_call_one", "dragon_call_two"


def render(
    segments: Segments,
    tools_segments: ToolSegments,
    messages: list[dict],
    tools: list[dict] | None,
    add_generation_prompt: bool = False,
) -> str:
    """The conversation as the pieces compose it: what the Ollama template with tools writes, in Python. (Ollama's
    template puts no suffix after a last assistant message: it continues it; this composes the suffix, as the
    chat template renders a conversation that ends with a reply.)"""
    t, out, previous = tools_segments, [], ""
    block = t.tools_prefix + t.tool_separator.join(_schema(tool) for tool in tools) + t.tools_suffix if tools else ""
    for i, message in enumerate(messages):
        role, content = message["role"], message.get("content") or ""
        if previous == "tool" and role != "tool":
            out.append(t.results_close)
        if i == 0:
            if role == "system":
                out.append(segments.start_with_system)
            elif tools:
                out += [t.start_tools_without_system, block, segments.system_suffix]
            else:
                out.append(segments.start_without_system)
        if role == "system":
            out += [content, block, segments.system_suffix]
        elif role == "user":
            out += [segments.user_prefix, content, segments.user_suffix]
        elif role == "assistant":
            out += [segments.assistant_prefix, content]
            for j, call in enumerate(message.get("tool_calls") or []):
                function = call.get("function", call)
                out.append(t.call_separator if j else t.call_after_content if content else "")
                out += [t.call_open, function["name"], t.call_middle, _schema(function["arguments"]), t.call_close]
            out.append(segments.assistant_suffix)
        elif role == "tool":
            out += [t.results_between if previous == "tool" else t.results_open, content]
        else:
            raise ExportError(f"no segments for role {role!r}")
        previous = role
    if previous == "tool":
        out.append(t.results_close)
    if add_generation_prompt:
        out.append(segments.generation_prompt)
    return "".join(out)


def _apply(tokenizer, messages: list[dict], tools: list[dict] | None = None, prompt: bool = False) -> str:
    try:
        return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=prompt)
    except Exception as exc:  # a template that raises on tools or tool turns
        raise ExportError(f"the chat template cannot render tools: {type(exc).__name__}: {exc}") from exc


def _between(text: str, start: str, end: str, what: str) -> tuple[str, str]:
    """(the text between the first `start` and the next `end`, what follows that `end`)."""
    if text.count(start) != 1 or end not in text.split(start, 1)[1]:
        raise ExportError(f"the chat template does not write {what} once, as JSON in a fixed frame")
    middle, rest = text.split(start, 1)[1].split(end, 1)
    return middle, rest


def _strip(text: str, prefix: str, suffix: str, what: str) -> str:
    if not text.startswith(prefix) or not text.endswith(suffix) or len(text) < len(prefix) + len(suffix):
        raise ExportError(f"the chat template writes {what} differently from its plain turns")
    return text[len(prefix) : len(text) - len(suffix)]


def derive_tools(tokenizer, segments: Segments) -> ToolSegments:
    """The tool pieces of the tokenizer's chat template (plain pieces: segments); ExportError naming what does not
    fit when the template renders tools some other way."""
    sg, (j1, j2) = segments, (_schema(tool) for tool in TOOLS)
    system, user = {"role": "system", "content": S}, {"role": "user", "content": U}
    turn = sg.user_prefix + U + sg.user_suffix

    text = _apply(tokenizer, [system, user], TOOLS)
    tools_prefix, rest = _between(text, sg.start_with_system + S, j1, "the tool schemas")
    tool_separator, rest = _between(j1 + rest, j1, j2, "the tool schemas")
    tools_suffix = _strip(rest, "", sg.system_suffix + turn, "the system turn with tools")
    text = _apply(tokenizer, [user], TOOLS[:1])
    start, rest = text.split(j1, 1) if text.count(j1) == 1 else ("", "")
    start = _strip(start, "", tools_prefix, "the tools without a system message")
    _strip(rest, tools_suffix + sg.system_suffix, turn, "the tools without a system message")

    before = _apply(tokenizer, [system, user])
    calls = {"role": "assistant", "content": C, "tool_calls": [_call(N1, A1), _call(N2, A2)]}
    text = _strip(_apply(tokenizer, [system, user, calls]), before, sg.assistant_suffix, "calls")
    opening, rest = _between(text, sg.assistant_prefix + C, N1, "a call's name")
    call_middle, rest = _between(N1 + rest, N1, _schema(A1), "a call's arguments")
    closing_opening, rest = _between(_schema(A1) + rest, _schema(A1), N2, "two calls")
    _strip(rest, call_middle + _schema(A2), "", "two calls")
    call_close = rest[len(call_middle + _schema(A2)) :]
    alone = {"role": "assistant", "content": "", "tool_calls": [_call(N1, A1)]}
    text = _strip(_apply(tokenizer, [system, user, alone]), before, sg.assistant_suffix, "a call")
    call_open = _strip(text, sg.assistant_prefix, N1 + call_middle + _schema(A1) + call_close, "a call alone")
    call_after_content = _strip(opening, "", call_open, "a call after text")
    call_separator = _strip(closing_opening, call_close, call_open, "two calls")

    before = _apply(tokenizer, [system, user, calls])
    results = [{"role": "tool", "content": R1}, {"role": "tool", "content": R2}]
    after = sg.user_prefix + U2 + sg.user_suffix
    one = _strip(
        _apply(tokenizer, [system, user, calls, results[0], {"role": "user", "content": U2}]), before, after, "a result"
    )
    if one.count(R1) != 1:
        raise ExportError("the chat template does not write a tool result once, in a fixed frame")
    results_open, results_close = one.split(R1)
    two = _strip(
        _apply(tokenizer, [system, user, calls, *results, {"role": "user", "content": U2}]), before, after, "results"
    )
    results_between = _strip(two, results_open + R1, R2 + results_close, "two results")

    pieces = ToolSegments(
        tools_prefix,
        tool_separator,
        tools_suffix,
        start,
        call_after_content,
        call_separator,
        call_open,
        call_middle,
        call_close,
        results_open,
        results_between,
        results_close,
    )
    check(tokenizer, segments, pieces)
    return pieces


CHECK = [
    [{"role": "system", "content": "Look orders up."}, {"role": "user", "content": "Where is A1042?"}],
    [
        {"role": "user", "content": "Where is A1042?"},
        {"role": "assistant", "content": "", "tool_calls": [_call("order_status", {"order_id": "A1042"})]},
        {"role": "tool", "content": '{"status": "shipped"}'},
    ],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Check both."},
        {"role": "assistant", "content": "Looking.", "tool_calls": [_call("a", {"x": 1}), _call("b", {})]},
        {"role": "tool", "content": "one"},
        {"role": "tool", "content": "two"},
        {"role": "assistant", "content": "Both fine."},
        {"role": "user", "content": "Thanks!"},
    ],
]


def check(tokenizer, segments: Segments, pieces: ToolSegments) -> None:
    """The pieces compose what the template renders, with tools and without, with and without a prompt."""
    for messages in CHECK:
        for tools in (TOOLS, None):
            for prompt in (True, False):
                if render(segments, pieces, messages, tools, prompt) != _apply(tokenizer, messages, tools, prompt):
                    raise ExportError(
                        "the chat template's tool parts are not fixed text around schemas, calls and results: "
                        f"composing them differs from the template for roles {[m['role'] for m in messages]} "
                        f"(tools={bool(tools)}, add_generation_prompt={prompt})"
                    )


def tool_support(tokenizer, segments: Segments) -> tuple[ToolSegments | None, str | None]:
    """(the tool pieces, None) when the Modelfile can render tools as the template does, else (None, why not)."""
    from ...tools.template import renders_tools

    if not renders_tools(tokenizer):
        return None, "the model's chat template renders no tools"
    try:
        return derive_tools(tokenizer, segments), None
    except ExportError as exc:
        return None, str(exc)
