"""An Ollama Modelfile beside the GGUF files: FROM the file, a TEMPLATE saying what the model's chat template says
(from chat_template.py's segments), PARAMETER stop for the end-of-turn tokens, and SYSTEM, the pipeline's
system prompt (Ollama puts it first in a conversation that has no system message of its own).

Every fixed text in the TEMPLATE is written as a Go string constant ({{ "..." }}): a chat template's newlines
then survive the `{{-` markers that keep the template readable, and a `{{` in the text cannot start an action.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from .chat_template import Segments
from .errors import ExportError

MODELFILE = "Modelfile"


def go_text(text: str) -> str:
    """A fixed text as a Go template action printing it: a JSON string is a valid Go string literal."""
    return "{{ " + json.dumps(text, ensure_ascii=False) + " }}" if text else ""


def go_template(segments: Segments) -> str:
    """The TEMPLATE: one range over .Messages; the generation prompt after the last user message, and no
    suffix after a last assistant message (Ollama continues it)."""
    t = go_text
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
            + "{{ if not $last }}"
            + t(segments.assistant_suffix)
            + "{{ end }}",
            "{{- end }}",
            "{{- end }}",
        ]
    )


def triple_quoted(text: str, what: str) -> str:
    if '"""' in text:
        raise ExportError(f'the {what} contains """, which a Modelfile cannot quote')
    return f'"""{text}"""'


def modelfile(gguf_name: str, segments: Segments, stops: list[str], system: str | None) -> str:
    lines = [f"FROM ./{gguf_name}", f"TEMPLATE {triple_quoted(go_template(segments), 'template')}"]
    lines += [f"PARAMETER stop {json.dumps(stop, ensure_ascii=False)}" for stop in stops]
    if system:
        lines.append(f"SYSTEM {triple_quoted(system, 'system prompt')}")
    return "\n".join(lines) + "\n"


def write_modelfile(
    export_dir: str | Path, gguf_name: str, segments: Segments, stops: list[str], system: str | None
) -> Path:
    path = Path(export_dir) / MODELFILE
    path.write_text(modelfile(gguf_name, segments, stops, system))
    return path


def create_command(export_dir: str | Path, name: str) -> str:
    """The line that makes the export an Ollama model: `ollama create <name> -f <dir>/Modelfile`."""
    return f"ollama create {shlex.quote(name)} -f {shlex.quote(str(Path(export_dir) / MODELFILE))}"
