"""Conversations in the layouts datasets come in, made into chat turns.

- messages (OpenAI): a column of [{"role": "system"|"user"|"assistant"|"tool", "content": ...}]; an assistant turn
  may carry tool_calls [{"type": "function", "function": {"name": ..., "arguments": {...}}}] (arguments as an
  object or JSON text, kept as an object), a tool turn its result with an optional name and tool_call_id;
- sharegpt: a column of [{"from": "human"|"gpt"|"system"|"tool"|"function_call"|..., "value": ...}]; a
  function_call turn's value is the call as JSON, {"name", "arguments"}, and becomes an assistant tool call;
- alpaca: instruction, optional input, and output columns;
- columns: prompt and response columns or templates (row_mapping.map_rows renders those).

A conversation becomes {"prompt": [every turn before the final assistant turn], "completion": [that turn]}
(conversation_row): tool-call turns and tool results stay in the prompt as context. A row's `tools` column (JSON
schemas) goes along as row["tools"]. A malformed row is a DataError naming its row, 1-based as in the file, and
the field, e.g. "row 3, messages[2]: unknown role 'bot'".
"""

from __future__ import annotations

import json
from typing import Any, Literal, get_args

from .errors import DataError

LAYOUTS = ("columns", "messages", "sharegpt", "alpaca")
# A chat message's role: the one definition every conversation in the engine (datasets, backends, the chat,
# feedback records) checks against.
Role = Literal["system", "user", "assistant", "tool"]
ROLES: tuple[str, ...] = get_args(Role)
CONVERSATION_COLUMNS = ("messages", "conversations")  # looked for, in order, when no column is named
TOOLS_COLUMN = "tools"
# ShareGPT's speakers as the datasets name them (FastChat, LLaMA-Factory, Glaive, OpenHermes)
SPEAKERS = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "assistant": "assistant",
    "model": "assistant",
    "system": "system",
    "tool": "tool",
    "observation": "tool",
    "function_response": "tool",
    "function_call": "function_call",
}


def choose_layout(
    columns: list[str], layout: str = "auto", prompt_response: bool = False, conversations: str | None = None
) -> tuple[str, str | None]:
    """(layout, conversations column) from the settings and the table's column names. Auto-detection may answer
    "conversations": a column of turns whose keys (role/content or from/value) tell messages from sharegpt
    (turn_style). prompt_response: the prompt and response settings are given."""
    if layout == "columns" or (layout == "auto" and prompt_response):
        return "columns", None
    if layout == "alpaca":
        missing = [c for c in ("instruction", "output") if c not in columns]
        if missing:
            raise DataError(f"alpaca layout needs column(s) {missing}; the dataset has {columns}")
        return "alpaca", None
    if conversations is not None:
        if conversations not in columns:
            raise DataError(f"conversations column {conversations!r} is missing; the dataset has {columns}")
        return ("conversations" if layout == "auto" else layout), conversations
    found = next((c for c in CONVERSATION_COLUMNS if c in columns), None)
    if layout in ("messages", "sharegpt"):
        if found is None:
            raise DataError(
                f"{layout} layout needs a column of conversations: set conversations, or name the column "
                f"'messages' or 'conversations'; the dataset has {columns}"
            )
        return layout, found
    if found is not None:
        return "conversations", found
    if "instruction" in columns and "output" in columns:
        return "alpaca", None
    raise DataError(
        "cannot tell the dataset's layout: looked for prompt and response settings, a 'messages' column, a "
        f"'conversations' column, and 'instruction' and 'output' columns; the dataset has {columns}. Set layout "
        "(columns, messages, sharegpt or alpaca) and the columns it reads"
    )


def turn_style(values: Any, sample: int = 20) -> str:
    """messages or sharegpt: the keys of the first turn among the first rows (role/content or from/value).
    A column where no turn tells is read as messages, whose parser then names the row at fault."""
    for value in list(values)[:sample]:
        try:
            turns = _list(value, "")
        except DataError:
            continue
        for turn in turns:
            if isinstance(turn, dict) and ("from" in turn or "value" in turn):
                return "sharegpt"
            if isinstance(turn, dict) and "role" in turn:
                return "messages"
    return "messages"


def parse_messages(value: Any, row: str, column: str = "messages") -> list[dict]:
    """OpenAI-style messages as clean turns: role and content (text), an assistant turn's tool_calls, a tool
    turn's name and tool_call_id."""
    turns = []
    for i, turn in enumerate(_list(value, f"{row}, {column}")):
        at = f"{row}, {column}[{i}]"
        if not isinstance(turn, dict):
            raise DataError(f"{at}: a message must be an object with a role, got {_show(turn)}")
        role = turn.get("role")
        if role not in ROLES:
            raise DataError(f"{at}: unknown role {role!r}; use system, user, assistant or tool")
        message = {"role": role, "content": content_text(turn.get("content"), f"{at}.content")}
        calls = turn.get("tool_calls")
        if calls is not None and calls != []:
            if role != "assistant":
                raise DataError(f"{at}.tool_calls: only an assistant turn calls tools, this is a {role} turn")
            message["tool_calls"] = [
                tool_call(c, f"{at}.tool_calls[{j}]") for j, c in enumerate(_list(calls, f"{at}.tool_calls"))
            ]
        if role == "tool":
            message.update({k: str(turn[k]) for k in ("name", "tool_call_id") if turn.get(k) is not None})
        turns.append(message)
    return turns


def parse_sharegpt(value: Any, row: str, column: str = "conversations") -> list[dict]:
    """ShareGPT turns as messages: speakers mapped to roles (SPEAKERS), a function_call turn as an assistant
    turn calling tools (consecutive ones as one turn making several calls)."""
    turns: list[dict] = []
    calling = False  # the last turn came from function_call turns: a next one adds its calls to it
    for i, turn in enumerate(_list(value, f"{row}, {column}")):
        at = f"{row}, {column}[{i}]"
        if not isinstance(turn, dict):
            raise DataError(f"{at}: a turn must be an object with from and value, got {_show(turn)}")
        speaker = turn.get("from")
        role = SPEAKERS.get(speaker.strip().lower()) if isinstance(speaker, str) else None
        if role is None:
            raise DataError(
                f"{at}.from: unknown speaker {speaker!r}; use human/user, gpt/assistant/model, system, "
                "tool/observation/function_response or function_call"
            )
        if role == "function_call":
            calls = sharegpt_calls(turn.get("value"), f"{at}.value")
            if calling:
                turns[-1]["tool_calls"] += calls
            else:
                turns.append({"role": "assistant", "content": "", "tool_calls": calls})
            calling = True
            continue
        calling = False
        turns.append({"role": role, "content": content_text(turn.get("value"), f"{at}.value")})
    return turns


def sharegpt_calls(value: Any, at: str) -> list[dict]:
    """A function_call turn's value, {"name", "arguments"} or a list of them (JSON text or objects), as calls."""
    if isinstance(value, str):
        value = _json(value, at)
    if isinstance(value, dict):
        return [tool_call(value, at)]
    return [tool_call(c, f"{at}[{j}]") for j, c in enumerate(_list(value, at))]


def tool_call(call: Any, at: str) -> dict:
    """One call as {"type": "function", "function": {"name", "arguments": an object}} (and its id when given);
    the flat {"name", "arguments"} some datasets write reads too."""
    if not isinstance(call, dict):
        raise DataError(f"{at}: a tool call must be an object, got {_show(call)}")
    if call.get("type") not in (None, "function"):
        raise DataError(f"{at}.type: only function calls are supported, got {call['type']!r}")
    function, where = (call["function"], f"{at}.function") if "function" in call else (call, at)
    if not isinstance(function, dict):
        raise DataError(f"{where}: must be an object with name and arguments, got {_show(function)}")
    name = function.get("name")
    if not isinstance(name, str) or not name.strip():
        raise DataError(f"{where}.name: a tool call needs the function's name, got {name!r}")
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        arguments = _json(arguments, f"{where}.arguments") if arguments.strip() else {}
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise DataError(f"{where}.arguments: must be a JSON object, got {_show(arguments)}")
    out = {"type": "function", "function": {"name": name, "arguments": arguments}}
    if call.get("id") is not None:  # what a tool turn's tool_call_id refers to
        out["id"] = str(call["id"])
    return out


def parse_tools(value: Any, row: str) -> list[dict] | None:
    """A row's tools column: JSON schemas (a list, or JSON text of one), each as {"type": "function",
    "function": {...}}; None when the cell is empty."""
    if value is None or (isinstance(value, float) and value != value) or (isinstance(value, str) and not value.strip()):
        return None
    tools = []
    for j, tool in enumerate(_list(value, f"{row}, {TOOLS_COLUMN}")):
        at = f"{row}, {TOOLS_COLUMN}[{j}]"
        if not isinstance(tool, dict):
            raise DataError(f"{at}: a tool must be a JSON schema object, got {_show(tool)}")
        if "function" not in tool and "name" in tool:  # a bare function schema: the form templates expect
            tool = {"type": "function", "function": tool}
        function = tool.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise DataError(f"{at}: a tool schema needs a function name, got {_show(tool)}")
        tools.append(tool)
    return tools or None


def alpaca_turns(record: dict, row: str) -> list[dict]:
    """An Alpaca record's user turn (the instruction, then the input after a blank line when there is one) and
    its reply (the output)."""
    for column in ("instruction", "output"):
        if _missing(record.get(column)):
            raise DataError(f"{row}: alpaca layout needs column {column!r}, which this row lacks")
    user = str(record["instruction"])
    extra = record.get("input")
    if not _missing(extra) and str(extra).strip():
        user += "\n\n" + str(extra)
    return [{"role": "user", "content": user}, {"role": "assistant", "content": str(record["output"])}]


def conversation_row(messages: list[dict], row: str | int = 0, column: str = "messages") -> dict:
    """A conversation (messages ending in an assistant turn) as a prompt-completion row: every turn before the
    final assistant turn is the prompt. row names the conversation in errors (an int: its 0-based index)."""
    row = row if isinstance(row, str) else f"conversation {row}"
    turns = parse_messages(messages, row, column)
    roles = [m["role"] for m in turns]
    if "user" not in roles:
        raise DataError(f"{row}: the conversation has no user turn")
    if roles[-1] != "assistant":
        raise DataError(f"{row}: the conversation must end with an assistant turn, it ends with {roles[-1]!r}")
    for i, message in enumerate(turns):
        if message["role"] == "tool" and not (i and (turns[i - 1].get("tool_calls") or roles[i - 1] == "tool")):
            raise DataError(f"{row}, {column}[{i}]: a tool turn must follow an assistant turn that calls tools")
    return {"prompt": turns[:-1], "completion": turns[-1:]}


def content_text(value: Any, at: str) -> str:
    """A turn's content as text: text as is, none as "", a list of text parts joined, any other JSON value
    (a tool's structured result) as JSON."""
    if _missing(value):
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(isinstance(p, dict) and "type" in p for p in value):
        texts = []
        for k, part in enumerate(value):
            if part["type"] != "text" or not isinstance(part.get("text"), str):
                raise DataError(f"{at}[{k}]: only text parts are supported, got type {part['type']!r}")
            texts.append(part["text"])
        return "\n".join(texts)
    return json.dumps(value, ensure_ascii=False)


def _list(value: Any, at: str) -> list:
    """A list from a cell: JSON text parsed, a Parquet/Arrow array (numpy) made plain."""
    if isinstance(value, str):
        value = _json(value, at)
    value = _plain(value)
    if not isinstance(value, list):
        raise DataError(f"{at}: must be a list, got {_show(value)}")
    return value


def _plain(value: Any) -> Any:
    """Python lists, dicts and scalars from what pandas holds for a Parquet or `datasets` column (numpy arrays
    of dicts), so that the same checks read every source."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) or type(value).__name__ == "ndarray":
        return [_plain(v) for v in value]
    if hasattr(value, "item") and type(value).__module__ == "numpy":  # a numpy scalar
        return value.item()
    return value


def _json(text: str, at: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"{at}: not JSON: {exc}") from None


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and value != value)  # NaN: pandas' empty cell


def _show(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
