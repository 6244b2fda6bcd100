"""Datasets: read tables, map columns (or `{col}` templates) to chat turns, hold rows out, write chat files.

A mapped row is TRL's conversational prompt-completion format:
    {"prompt": [{"role": "system"|"user"|"assistant"|"tool", "content": ...}, ...],
     "completion": [{"role": "assistant", "content": ...}]}
(and "tools" when the row declares some), so the trainer computes loss on the final assistant turn by default;
earlier turns are context (dragon_conversations). Conversation layouts are parsed in conversations.py.
"""

from __future__ import annotations

import json
import os
import random
import string
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import conversations
from .errors import DataError

if TYPE_CHECKING:  # pandas loads when a table is read: a worker that never reads one starts without it
    import pandas as pd


FORMATS = {".csv": "csv", ".jsonl": "jsonl", ".json": "json", ".parquet": "parquet", ".pq": "parquet"}
# A table is read whole into memory (and again as chat rows): a file past this fails with a named error
# instead of exhausting memory. Raise it with DRAGON_MAX_TABLE_MB on a machine that has the room.
MAX_TABLE_MB = 1024


def max_table_bytes() -> int:
    return int(float(os.environ.get("DRAGON_MAX_TABLE_MB", MAX_TABLE_MB)) * 2**20)


def read_table(source: str | Path | pd.DataFrame, format: str | None = None) -> pd.DataFrame:
    """Read CSV, JSONL, JSON, Parquet, a saved `datasets` directory, or pass a data frame through."""
    import pandas as pd

    if isinstance(source, pd.DataFrame):
        df = source.copy()
    else:
        path = Path(source)
        if not path.exists():
            raise DataError(f"dataset file not found: {path}")
        if path.is_dir():
            df = _read_datasets_dir(path)
        else:
            fmt = format or FORMATS.get(path.suffix.lower())
            if fmt is None:
                raise DataError(f"cannot tell the format of {path}: use one of {sorted(FORMATS)} or set format")
            size, limit = path.stat().st_size, max_table_bytes()
            if size > limit:
                raise DataError(
                    f"{path} is {size / 2**20:,.0f} MB, over the {limit / 2**20:,.0f} MB a table may "
                    "have: split it, sample the rows you train on, or raise DRAGON_MAX_TABLE_MB"
                )
            try:
                df = {
                    "csv": lambda: pd.read_csv(path, dtype=str, keep_default_na=False),
                    "jsonl": lambda: pd.read_json(path, lines=True, dtype=False),
                    "json": lambda: pd.read_json(path, dtype=False),
                    "parquet": lambda: pd.read_parquet(path),
                }[fmt]()
            except (ValueError, OSError, UnicodeDecodeError) as exc:
                raise DataError(f"cannot read {path} as {fmt}: {exc}") from exc
            except MemoryError as exc:  # pyarrow's ArrowMemoryError is one
                raise DataError(
                    f"not enough memory to read {path} ({size / 2**20:,.0f} MB): split it or "
                    "sample the rows you train on"
                ) from exc
    if len(df) == 0:
        raise DataError(
            f"dataset {'data frame' if isinstance(source, pd.DataFrame) else getattr(source, 'name', '') or source} "
            "is empty (no rows)"
        )
    return df.reset_index(drop=True)


def _read_datasets_dir(path: Path) -> pd.DataFrame:
    import datasets

    try:
        ds = datasets.load_from_disk(str(path))
    except (FileNotFoundError, ValueError) as exc:
        raise DataError(f"{path} is not a saved `datasets` directory: {exc}") from exc
    if isinstance(ds, datasets.DatasetDict):
        split = "train" if "train" in ds else next(iter(ds))
        ds = ds[split]
    return ds.to_pandas()


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
        return _text(row[spec])
    if "{" not in spec and "}" not in spec:  # a constant text, e.g. one system prompt for every row
        return spec
    return spec.format(**{name: _text(row[name]) for name in template_fields(spec)})


def _text(value: Any) -> str:
    if value is None or (isinstance(value, float) and value != value):  # NaN: pandas' empty cell
        return ""
    return str(value)


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


conversation_row = conversations.conversation_row  # where callers have long found it


def split_rows(
    rows: list[dict], eval_frac: float = 0.05, seed: int = 42, groups: list[str] | None = None
) -> tuple[list[dict], list[dict]]:
    """Hold out eval_frac of the rows (none under 20 rows, at least one otherwise), shuffled by seed.

    groups: one value per row; rows with the same value land on the same side. Whole groups are held out in
    shuffled order, each one taken when it brings the held-out count closer to eval_frac of the rows, so the
    held-out share is near eval_frac rather than exact; at least one group stays in train. Without groups
    every row is its own group (the plain per-row split)."""
    if not 0 <= eval_frac < 1:
        raise DataError(f"eval_frac must be in [0, 1), got {eval_frac!r}")
    if not rows:
        raise DataError("dataset is empty: no rows to train on")
    if groups is not None and len(groups) != len(rows):
        raise DataError(f"{len(groups)} group values for {len(rows)} rows")
    n_eval = 0 if len(rows) < 20 or eval_frac == 0 else max(1, round(len(rows) * eval_frac))
    members: dict[str, list[int]] = {}
    for i, value in enumerate(groups if groups is not None else range(len(rows))):
        members.setdefault(value, []).append(i)
    if n_eval and len(members) < 2:
        raise DataError(
            f"every row is in one group ({next(iter(members))!r}): nothing can be held out without "
            "leaking; group by another column or set eval_frac: 0"
        )
    order = list(members.values())
    random.Random(seed).shuffle(order)
    held: set[int] = set()
    taken = 0
    for group in order:
        if len(held) >= n_eval or taken == len(order) - 1:  # one group at least stays in train
            break
        if abs(len(held) + len(group) - n_eval) < abs(len(held) - n_eval):
            held.update(group)
            taken += 1
    if n_eval and not held:  # every group is far bigger than the share: hold out the smallest
        held.update(min(order, key=len))
    train = [r for i, r in enumerate(rows) if i not in held]
    evals = [r for i, r in enumerate(rows) if i in held]
    return train, evals


def row_key(row: dict) -> str:
    """What makes two rows the same example: the prompt turns and the reply (a pair's both replies, a prompt's
    reference), and the tools it may call. Other columns a prompt row carries do not count."""
    parts = [
        row.get("prompt"),
        row.get("completion"),
        row.get("chosen"),
        row.get("rejected"),
        row.get("reference"),
        row.get("label"),
    ]
    if row.get("tools"):  # appended only when there are tools: the keys of rows without stay as they were
        parts.append(row["tools"])
    return json.dumps(parts, sort_keys=True, ensure_ascii=False)


def dedupe_rows(rows: list[dict], groups: list[str] | None = None) -> tuple[list[dict], list[str] | None, int]:
    """Exact duplicate rows dropped (the first kept), the group values of the rows kept, and how many dropped."""
    seen: set[str] = set()
    kept, kept_groups = [], []
    for i, row in enumerate(rows):
        k = row_key(row)
        if k in seen:
            continue
        seen.add(k)
        kept.append(row)
        if groups is not None:
            kept_groups.append(groups[i])
    return kept, (kept_groups if groups is not None else None), len(rows) - len(kept)


def group_values(df: pd.DataFrame, spec: str) -> list[str]:
    """The group_by value of every source row: a column or a `{col}` template, read before mapping."""
    check_columns(df, {"group_by": spec})
    if spec in df.columns:
        return [_text(v) for v in df[spec]]
    return [render(spec, record) for record in df.to_dict(orient="records")]


def answer_text(row: dict) -> str:
    """The answer a row holds: its reply (a pair's chosen one) or, for a prompt row, its reference. A disliked
    reply is no answer: the same bad reply to many prompts teaches nothing about the held-out ones."""
    if row.get("label") is False:
        return ""
    return reply_text(row) or _text(row.get("reference"))


def overlap(train: list[dict], held: list[dict]) -> dict[str, float]:
    """Leakage between the sides: the share of held-out rows whose user prompt text appears word for word in
    train (prompt_overlap), and the share whose reply or reference does (answer_overlap; empty answers never
    count). 0.0 when nothing is held out."""
    if not held:
        return {"prompt_overlap": 0.0, "answer_overlap": 0.0}
    prompts = {user_text(r) for r in train}
    answers = {a for a in (answer_text(r) for r in train) if a.strip()}
    prompt_hits = sum(user_text(r) in prompts for r in held)
    answer_hits = sum(bool(answer_text(r).strip()) and answer_text(r) in answers for r in held)
    return {"prompt_overlap": round(prompt_hits / len(held), 4), "answer_overlap": round(answer_hits / len(held), 4)}


def write_jsonl(path: Path, rows: list[dict]) -> None:
    with Path(path).open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def read_jsonl(path: Path) -> list[dict]:
    with Path(path).open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def user_text(row: dict) -> str:
    """The last user turn of a chat row, for previews and reports."""
    return next(m["content"] for m in reversed(row["prompt"]) if m["role"] == "user")


def reply_text(row: dict) -> str:
    """The reply a row teaches: the completion, or the chosen reply of a pair ("" for a bare prompt)."""
    for column in ("completion", "chosen"):
        if column in row:
            return row[column][-1]["content"]
    return ""


def calls_tools(row: dict) -> bool:
    """Whether the reply a row teaches calls tools (then it may have no text and still be a reply)."""
    for column in ("completion", "chosen"):
        if column in row:
            return bool(row[column][-1].get("tool_calls"))
    return False


def quality(rows: list[dict]) -> dict[str, Any]:
    """Counts an asset check and the metadata show: empty turns (a reply that only calls tools is not empty)
    and duplicate share."""
    empty_prompt = sum(1 for r in rows if not user_text(r).strip())
    empty_reply = sum(
        1 for r in rows if ("completion" in r or "chosen" in r) and not reply_text(r).strip() and not calls_tools(r)
    )
    keys = [json.dumps(r, sort_keys=True) for r in rows]
    duplicate_share = (1 - len(set(keys)) / len(keys)) if keys else 0.0
    return {
        "rows": len(rows),
        "empty_prompts": empty_prompt,
        "empty_replies": empty_reply,
        "duplicate_share": round(duplicate_share, 4),
    }


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
        fields = {k: _text(v) for k, v in record.items() if k not in ("prompt", "reference")}
        row = {**fields, "prompt": user_turns(mapping.prompt, mapping.system, record)}
        if mapping.reference:
            row["reference"] = render(mapping.reference, record)
        rows.append(row)
    return rows
