"""An Ollama Modelfile beside the GGUF files: FROM the file, a TEMPLATE saying what the model's chat template says
(from chat_template.py's segments), PARAMETER stop for the end-of-turn tokens, and SYSTEM, the pipeline's
system prompt (Ollama puts it first in a conversation that has no system message of its own).

When the chat template renders tools in fixed text around schemas, calls and results (tool_template.py; the
fallback format a merged model of a pipeline with tools carries does), the TEMPLATE renders them too: Ollama's
`.Tools` in the system turn, an assistant message's `.ToolCalls`, and "tool" messages, so `ollama run` and
Ollama's chat API with `tools` show the model its tools as training did, and Ollama reads the calls back out of
the reply by the call's opening text in the TEMPLATE. Otherwise the TEMPLATE has no tool parts, and the card
says so.

Every fixed text in the TEMPLATE is written as a Go string constant ({{ "..." }}): a chat template's newlines
then survive the `{{-` markers that keep the template readable, and a `{{` in the text cannot start an action.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from .chat_template import Segments
from .errors import ExportError
from .tool_template import ToolSegments

MODELFILE = "Modelfile"


def go_text(text: str) -> str:
    """A fixed text as a Go template action printing it: a JSON string is a valid Go string literal."""
    return "{{ " + json.dumps(text, ensure_ascii=False) + " }}" if text else ""


def go_template(segments: Segments, tools: ToolSegments | None = None) -> str:
    """The TEMPLATE: one range over .Messages; the generation prompt after the last user message, and no
    suffix after a last assistant message (Ollama continues it). With `tools`, also what tool_template.render
    composes: the schemas in the system turn, the calls after an assistant message's content, and each run of
    tool messages in its frame ($prev, the role before, says where a run starts and ends)."""
    t = go_text
    if tools is None:
        return "\n".join(
            [
                "{{- range $i, $_ := .Messages }}",
                "{{- $last := eq (len (slice $.Messages $i)) 1 }}",
                '{{- if eq $i 0 }}{{ if eq .Role "system" }}'
                + t(segments.start_with_system)
                + "{{ else }}"
                + t(segments.start_without_system)
                + "{{ end }}{{ end }}",
                '{{- if eq .Role "system" }}{{ .Content }}' + t(segments.system_suffix),
                *_user_and_assistant(segments),
                "{{- end }}",
                "{{- end }}",
            ]
        )
    schemas = (
        "{{ if $.Tools }}"
        + t(tools.tools_prefix)
        + "{{ range $j, $_ := $.Tools }}{{ if $j }}"
        + t(tools.tool_separator)
        + "{{ end }}"
        + t('{"type": "function", "function": ')  # the schema as tojson writes it, around Ollama's function
        + "{{ .Function }}"
        + t("}")
        + "{{ end }}"
        + t(tools.tools_suffix)
        + "{{ end }}"
    )
    calls = (
        "{{ $content := .Content }}{{ range $j, $_ := .ToolCalls }}{{ if $j }}"
        + t(tools.call_separator)
        + "{{ else if $content }}"
        + t(tools.call_after_content)
        + "{{ end }}"
        + t(tools.call_open)
        + "{{ .Function.Name }}"
        + t(tools.call_middle)
        + "{{ .Function.Arguments }}"
        + t(tools.call_close)
        + "{{ end }}"
    )
    return "\n".join(
        [
            '{{- $prev := "" }}',
            "{{- range $i, $_ := .Messages }}",
            "{{- $last := eq (len (slice $.Messages $i)) 1 }}",
            '{{- if and (eq $prev "tool") (ne .Role "tool") }}' + t(tools.results_close) + "{{ end }}",
            '{{- if eq $i 0 }}{{ if eq .Role "system" }}'
            + t(segments.start_with_system)
            + "{{ else if $.Tools }}"
            + t(tools.start_tools_without_system)
            + schemas
            + t(segments.system_suffix)
            + "{{ else }}"
            + t(segments.start_without_system)
            + "{{ end }}{{ end }}",
            '{{- if eq .Role "system" }}{{ .Content }}' + schemas + t(segments.system_suffix),
            *_user_and_assistant(segments, calls),
            '{{- else if eq .Role "tool" }}{{ if eq $prev "tool" }}'
            + t(tools.results_between)
            + "{{ else }}"
            + t(tools.results_open)
            + "{{ end }}{{ .Content }}{{ if $last }}"
            + t(tools.results_close)
            + t(segments.generation_prompt)
            + "{{ end }}",
            "{{- end }}",
            "{{- $prev = .Role }}",
            "{{- end }}",
        ]
    )


def _user_and_assistant(segments: Segments, calls: str = "") -> list[str]:
    """The user and assistant branches of the TEMPLATE's range (calls: what follows an assistant's content)."""
    t = go_text
    return [
        '{{- else if eq .Role "user" }}'
        + t(segments.user_prefix)
        + "{{ .Content }}"
        + t(segments.user_suffix)
        + "{{ if $last }}"
        + t(segments.generation_prompt)
        + "{{ end }}",
        '{{- else if eq .Role "assistant" }}'
        + t(segments.assistant_prefix)
        + "{{ .Content }}"
        + calls
        + "{{ if not $last }}"
        + t(segments.assistant_suffix)
        + "{{ end }}",
    ]


def triple_quoted(text: str, what: str) -> str:
    if '"""' in text:
        raise ExportError(f'the {what} contains """, which a Modelfile cannot quote')
    return f'"""{text}"""'


def modelfile(
    gguf_name: str, segments: Segments, stops: list[str], system: str | None, tools: ToolSegments | None = None
) -> str:
    lines = [f"FROM ./{gguf_name}", f"TEMPLATE {triple_quoted(go_template(segments, tools), 'template')}"]
    lines += [f"PARAMETER stop {json.dumps(stop, ensure_ascii=False)}" for stop in stops]
    if system:
        lines.append(f"SYSTEM {triple_quoted(system, 'system prompt')}")
    return "\n".join(lines) + "\n"


def write_modelfile(
    export_dir: str | Path,
    gguf_name: str,
    segments: Segments,
    stops: list[str],
    system: str | None,
    tools: ToolSegments | None = None,
) -> Path:
    path = Path(export_dir) / MODELFILE
    path.write_text(modelfile(gguf_name, segments, stops, system, tools))
    return path


def create_command(export_dir: str | Path, name: str) -> str:
    """The line that makes the export an Ollama model: `ollama create <name> -f <dir>/Modelfile`."""
    return f"ollama create {shlex.quote(name)} -f {shlex.quote(str(Path(export_dir) / MODELFILE))}"
