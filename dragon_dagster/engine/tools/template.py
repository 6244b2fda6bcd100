"""How conversations with tools become text: the model's own chat template when it renders tools, else one
documented fallback format for ChatML models (the embedded SmolLM2's template renders no tools).

The fallback is the Hermes/Qwen2.5 convention, which many open models were trained on and TRL parses:
- the system turn ends with the tool schemas, one JSON object a line, inside <tools></tools>, and how to call;
- an assistant turn that calls tools writes each call as {"name": ..., "arguments": {...}} inside
  <tool_call></tool_call> after its text;
- tool results come back as a user turn holding one <tool_response></tool_response> block per result.
A conversation without tools renders exactly as SmolLM2's own template renders it (the same default system
turn), so turning tools on changes nothing for the rows that have none. The assistant turns are wrapped in
`{% generation %}` marks, which is what lets SFT train on every assistant turn (TRL's assistant_only_loss).

The same tokenizer, with the same template, is used in training, evaluation, chat and export: `prepare`
returns which rendering it is ("native" or "fallback"), and the stages show it in their metadata.
"""

from __future__ import annotations

import json
import re
from typing import Literal

Rendering = Literal["native", "fallback", "none"]
CHATML = ("<|im_start|>", "<|im_end|>")
PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "probe_tool_d7f3",
        "description": "A probe.",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
    },
}
PROBE_CALL = {"type": "function", "function": {"name": "probe_call_9b1e", "arguments": {"q": "x"}}}

TOOLS_PREAMBLE = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
CALL_INSTRUCTIONS = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call>"
)


class TemplateError(ValueError):
    """The model's chat template cannot render tools and the fallback format does not fit it."""


def fallback_template(default_system: str | None) -> str:
    """The fallback chat template (a Jinja string), with the model's own default system turn when it has one."""
    default = json.dumps(default_system) if default_system else "none"
    return (
        "{%- set default_system = " + default + " %}"
        "{%- if messages and messages[0]['role'] == 'system' %}"
        "{%- set system = messages[0]['content'] %}{%- set rest = messages[1:] %}"
        "{%- else %}{%- set system = default_system %}{%- set rest = messages %}{%- endif %}"
        "{%- if tools %}"
        "{{- '<|im_start|>system\\n' }}{%- if system %}{{- system }}{%- endif %}"
        "{{- " + json.dumps(TOOLS_PREAMBLE) + " }}"
        "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
        "{{- " + json.dumps(CALL_INSTRUCTIONS) + " }}{{- '<|im_end|>\\n' }}"
        "{%- elif system is not none %}"
        "{{- '<|im_start|>system\\n' + system + '<|im_end|>\\n' }}"
        "{%- endif %}"
        "{%- for message in rest %}"
        "{%- if message['role'] == 'assistant' %}"
        "{{- '<|im_start|>assistant\\n' }}"
        "{%- generation %}"
        "{%- if message['content'] %}{{- message['content'] }}{%- endif %}"
        "{%- for call in message['tool_calls'] or [] %}"
        "{%- if call['function'] is defined %}{%- set call = call['function'] %}{%- endif %}"
        "{%- if loop.first and message['content'] %}{{- '\\n' }}{%- elif not loop.first %}{{- '\\n' }}{%- endif %}"
        "{{- '<tool_call>\\n{\"name\": \"' + call['name'] + '\", \"arguments\": ' }}"
        "{%- if call['arguments'] is string %}{{- call['arguments'] }}{%- else %}{{- call['arguments'] | tojson }}"
        "{%- endif %}"
        "{{- '}\\n</tool_call>' }}"
        "{%- endfor %}"
        "{{- '<|im_end|>' }}"
        "{%- endgeneration %}"
        "{{- '\\n' }}"
        "{%- elif message['role'] == 'tool' %}"
        "{%- if loop.first or rest[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
        "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
        "{%- if loop.last or rest[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
        "{%- else %}"
        "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
        "{%- endif %}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )


def _render(tokenizer, messages: list[dict], **kwargs) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)


def renders_tools(tokenizer) -> bool:
    """Whether the tokenizer's own template shows a tool's schema and an assistant's tool call."""
    if not getattr(tokenizer, "chat_template", None):
        return False
    try:
        with_tools = _render(tokenizer, [{"role": "user", "content": "hi"}], tools=[PROBE_TOOL])
        with_call = _render(
            tokenizer,
            [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": [PROBE_CALL]}],
        )
    except Exception:  # noqa: BLE001 - a template that raises on tools does not render them
        return False
    return PROBE_TOOL["function"]["name"] in with_tools and PROBE_CALL["function"]["name"] in with_call


def default_system(tokenizer) -> str | None:
    """The system turn a ChatML template adds when a conversation has none (SmolLM2's names itself)."""
    text = _render(tokenizer, [{"role": "user", "content": "hi"}])
    match = re.match(r"\s*<\|im_start\|>system\n(.*?)<\|im_end\|>", text, re.DOTALL)
    return match.group(1) if match else None


def is_chatml(tokenizer) -> bool:
    vocab = tokenizer.get_vocab()
    return all(token in vocab for token in CHATML)


def uses_tools(rows: list[dict]) -> bool:
    """Whether any row declares tools or has a turn that calls one or answers for one: rows a template must render
    tools for (training readied the template for them, so whatever scores the model renders them the same)."""
    for row in rows:
        turns = row.get("prompt", []) + row.get("completion", [])
        if row.get("tools") or any(m.get("role") == "tool" or m.get("tool_calls") for m in turns):
            return True
    return False


def prepare(tokenizer, needed: bool = True) -> Rendering:
    """Make tokenizer render tools and tool turns; which way it does. needed=False (no tools, no tool turns)
    leaves a template alone ("none") unless it is ChatML, where the fallback renders the same text and adds
    the generation marks every-turn SFT needs."""
    if needed and renders_tools(tokenizer):
        return "native"
    if not is_chatml(tokenizer) or not getattr(tokenizer, "chat_template", None):
        if not needed:
            return "none"
        raise TemplateError(
            f"the chat template of {getattr(tokenizer, 'name_or_path', 'this model')!r} renders no tools and is "
            "not ChatML (<|im_start|>/<|im_end|>), so the fallback tool format does not fit it: use a model whose "
            "template supports tools"
        )
    tokenizer.chat_template = fallback_template(default_system(tokenizer))
    _parse_calls_like_hermes(tokenizer)
    return "fallback"


def _parse_calls_like_hermes(tokenizer) -> None:
    """TRL parses a reply's tool calls with the tokenizer's response template: the fallback writes calls the
    way Qwen's templates do, so TRL's parser for those reads them."""
    try:
        from trl.chat_template_utils import _SUPPORTS_RESPONSE_TEMPLATE, qwen3_schema, qwen3_template
    except ImportError:  # TRL not installed where this runs (a chat server): replies are parsed by calls.py
        return
    if _SUPPORTS_RESPONSE_TEMPLATE:
        tokenizer.response_template = qwen3_template
    else:
        tokenizer.response_schema = qwen3_schema
