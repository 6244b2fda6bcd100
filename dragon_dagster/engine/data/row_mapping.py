"""Table rows mapped into chat examples: columns or `{col}` templates into turns, a column of conversations
(messages, ShareGPT) or Alpaca's columns, pairs, rated replies and prompts.

A mapped row is TRL's conversational prompt-completion format:
    {"prompt": [{"role": "system"|"user"|"assistant"|"tool", "content": ...}, ...],
     "completion": [{"role": "assistant", "content": ...}]}
(and "tools" when the row declares some), so the trainer computes loss on the final assistant turn by default;
earlier turns are context (dragon_conversations). Conversation layouts are parsed in conversations.py.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import conversations
from .errors import DataError
from .row_parts import text_of

if TYPE_CHECKING:
    import pandas as pd


def template_fields(spec: str) -> list[str]:
    """Column names a mapping spec uses: the `{col}` fields of a template, or the spec itself."""
    if "{" not in spec and "}" not in spec:
        return [spec]
    try:
        fields = [name for _, name, _, _ in string.Formatter().parse(spec) if name is not None]
    except ValueError as exc:
        raise DataError(f"bad template {spec!r}: {exc}") from exc
    for name in fields:
        if not name or any(c in name for c in ".[]!:"):
            raise DataError(f"bad template {spec!r}: each {{field}} must name one column")
    return fields


def render(spec: str, row: dict[str, Any]) -> str:
    if spec in row:
        return text_of(row[spec])
    if "{" not in spec and "}" not in spec:  # a constant text, e.g. one system prompt for every row
        return spec
    return spec.format(**{name: text_of(row[name]) for name in template_fields(spec)})


def check_columns(df: pd.DataFrame, specs: dict[str, str | None]) -> None:
    columns = list(df.columns)
    for role, spec in specs.items():
        if spec is None or spec in columns or (role == "system" and "{" not in spec and "}" not in spec):
            continue
        missing = [f for f in template_fields(spec) if f not in columns]
        if missing:
            raise DataError(f"{role} mapping {spec!r} names missing column(s) {missing}; the dataset has {columns}")


@dataclass(frozen=True)
class Mapping:
    """Which columns (or templates) become the turns: prompt+response, or a column of conversations (messages or
    ShareGPT), or Alpaca's instruction/input/output; layout "auto" tells which from the settings and columns."""

    prompt: str | None = None
    response: str | None = None
    system: str | None = None
    conversations: str | None = None
    layout: str = "auto"

    def validate(self) -> Mapping:
        if self.layout not in ("auto", *conversations.LAYOUTS):
            raise DataError(f"unknown layout {self.layout!r}; use auto, {', '.join(conversations.LAYOUTS)}")
        if bool(self.prompt) != bool(self.response):
            raise DataError("a mapping needs both prompt and response (column names or templates), or neither")
        if self.layout == "columns" and not self.prompt:
            raise DataError("the columns layout needs prompt and response (column names or templates)")
        if self.prompt and self.layout not in ("auto", "columns"):
            raise DataError(f"prompt and response are for the columns layout, not {self.layout}")
        if self.prompt and self.conversations:
            raise DataError("give prompt and response, or conversations, not both")
        if self.conversations and self.layout in ("columns", "alpaca"):
            raise DataError(f"conversations names a column of conversations, which the {self.layout} layout has not")
        return self


def user_turns(prompt: str, system: str | None, record: dict) -> list[dict]:
    """The rendered user turn of a row, after the rendered system turn when there is one."""
    turns = [{"role": "user", "content": render(prompt, record)}]
    if system:
        turns.insert(0, {"role": "system", "content": render(system, record)})
    return turns


def map_rows(df: pd.DataFrame, mapping: Mapping) -> list[dict]:
    """Render every row into a prompt-completion chat example, in the mapping's layout (conversations.py)."""
    mapping.validate()
    columns = list(df.columns)
    layout, column = conversations.choose_layout(
        columns, mapping.layout, bool(mapping.prompt and mapping.response), mapping.conversations
    )
    if layout == "columns":
        check_columns(df, {"prompt": mapping.prompt, "response": mapping.response, "system": mapping.system})
    else:
        check_columns(df, {"system": mapping.system})
    if layout == "conversations":
        layout = conversations.turn_style(df[column])
    rows = []
    for i, record in enumerate(df.to_dict(orient="records")):
        where = f"row {i + 1}"
        if layout == "columns":
            rows.append(
                {
                    "prompt": user_turns(mapping.prompt, mapping.system, record),
                    "completion": [{"role": "assistant", "content": render(mapping.response, record)}],
                }
            )
            continue
        if layout == "alpaca":
            turns = conversations.alpaca_turns(record, where)
        elif layout == "sharegpt":
            turns = conversations.parse_sharegpt(record[column], where, column)
        else:
            turns = record[column]
        row = conversations.conversation_row(turns, where, column)
        if mapping.system and not any(m["role"] == "system" for m in row["prompt"]):
            row["prompt"].insert(0, {"role": "system", "content": render(mapping.system, record)})
        if layout != "alpaca" and conversations.TOOLS_COLUMN in record:
            tools = conversations.parse_tools(record[conversations.TOOLS_COLUMN], where)
            if tools:
                row["tools"] = tools
        rows.append(row)
    return rows


@dataclass(frozen=True)
class PairsMapping:
    """Preference pairs (dragon_map_pairs): a prompt and a chosen and a rejected reply, columns or templates."""

    prompt: str
    chosen: str
    rejected: str
    system: str | None = None


def map_pairs(
    df: pd.DataFrame, mapping: PairsMapping, kept: list[int] | None = None
) -> tuple[list[dict], dict[str, int]]:
    """Rows in TRL's conversational preference format, and counts of pairs dropped by reason. kept: a list the
    source position of every kept row is appended to (to carry a group_by value along)."""
    check_columns(
        df, {"prompt": mapping.prompt, "chosen": mapping.chosen, "rejected": mapping.rejected, "system": mapping.system}
    )
    rows, dropped = [], {"chosen_equals_rejected": 0, "empty": 0}
    for position, record in enumerate(df.to_dict(orient="records")):
        prompt, chosen, rejected = (render(s, record) for s in (mapping.prompt, mapping.chosen, mapping.rejected))
        if not prompt.strip() or not chosen.strip() or not rejected.strip():
            dropped["empty"] += 1
            continue
        if chosen.strip() == rejected.strip():  # no preference signal; DPO would learn nothing from it
            dropped["chosen_equals_rejected"] += 1
            continue
        rows.append(
            {
                "prompt": user_turns(mapping.prompt, mapping.system, record),
                "chosen": [{"role": "assistant", "content": chosen}],
                "rejected": [{"role": "assistant", "content": rejected}],
            }
        )
        if kept is not None:
            kept.append(position)
    if not rows:
        raise DataError(f"no usable preference pairs: every row was dropped ({dropped})")
    return rows, dropped


LIKED = {"true", "1", "yes", "y", "up", "good", "liked", "like", "desirable", "positive", "+1", "chosen"}


DISLIKED = {"false", "0", "no", "n", "down", "bad", "disliked", "dislike", "undesirable", "negative", "-1", "rejected"}


def parse_label(value: Any) -> bool:
    """A liked/disliked label from a table cell; DataError naming the value when it is neither."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (-1, 0, 1):  # a numeric column read as floats too
        return value == 1
    text = str(value).strip().lower()
    if text.endswith(".0") and text[:-2] in ("0", "1", "-1", "+1"):  # numbers read as text
        text = text[:-2]
    if text in LIKED or text in DISLIKED:
        return text in LIKED
    raise DataError(
        f"label {value!r} is neither liked ({', '.join(sorted(LIKED))}) nor disliked ({', '.join(sorted(DISLIKED))})"
    )


@dataclass(frozen=True)
class RatedMapping:
    """Rated replies (for KTO): a prompt, a reply and a liked/disliked label column."""

    prompt: str
    reply: str
    label: str
    system: str | None = None


def map_rated(
    df: pd.DataFrame, mapping: RatedMapping, kept: list[int] | None = None
) -> tuple[list[dict], dict[str, int]]:
    """Rows in TRL's unpaired preference format ({"prompt", "completion", "label"}), and counts dropped. kept: a
    list the source position of every kept row is appended to (to carry a group_by value along)."""
    check_columns(
        df, {"prompt": mapping.prompt, "reply": mapping.reply, "label": mapping.label, "system": mapping.system}
    )
    if mapping.label not in df.columns:
        raise DataError(
            f"label {mapping.label!r} must name one column (not a template); the dataset has {list(df.columns)}"
        )
    rows, dropped = [], {"empty": 0}
    for position, record in enumerate(df.to_dict(orient="records")):
        prompt, reply = render(mapping.prompt, record), render(mapping.reply, record)
        if not prompt.strip() or not reply.strip():
            dropped["empty"] += 1
            continue
        try:
            label = parse_label(record[mapping.label])
        except DataError as exc:
            raise DataError(f"row {position + 1}, column {mapping.label!r}: {exc}") from None
        rows.append(
            {
                "prompt": user_turns(mapping.prompt, mapping.system, record),
                "completion": [{"role": "assistant", "content": reply}],
                "label": label,
            }
        )
        if kept is not None:
            kept.append(position)
    if not rows:
        raise DataError(f"no usable rated replies: every row was dropped ({dropped})")
    return rows, dropped


def unpaired(rows: list[dict]) -> list[dict]:
    """Rows for KTO: rated rows as they are; each preference pair as its chosen reply (liked) and its rejected
    reply (disliked), as TRL's unpair_preference_dataset does."""
    out = []
    for row in rows:
        if "chosen" in row:
            out += [
                {"prompt": row["prompt"], "completion": row["chosen"], "label": True},
                {"prompt": row["prompt"], "completion": row["rejected"], "label": False},
            ]
        else:
            out.append({"prompt": row["prompt"], "completion": row["completion"], "label": bool(row["label"])})
    return out


@dataclass(frozen=True)
class PromptsMapping:
    """Prompts to practise on (dragon_map_prompts): an optional reference; other columns travel along."""

    prompt: str
    reference: str | None = None
    system: str | None = None


def map_prompts(df: pd.DataFrame, mapping: PromptsMapping) -> list[dict]:
    check_columns(df, {"prompt": mapping.prompt, "reference": mapping.reference, "system": mapping.system})
    rows = []
    for record in df.to_dict(orient="records"):
        fields = {k: text_of(v) for k, v in record.items() if k not in ("prompt", "reference")}
        row = {**fields, "prompt": user_turns(mapping.prompt, mapping.system, record)}
        if mapping.reference:
            row["reference"] = render(mapping.reference, record)
        rows.append(row)
    return rows
