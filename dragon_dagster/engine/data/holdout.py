"""Rows held out and kept apart: the held-out split (whole groups on one side), exact duplicates dropped, each
row's group read from the table, and the leakage between the two sides measured."""

from __future__ import annotations

import json
import random
from typing import TYPE_CHECKING

from .errors import DataError
from .row_mapping import check_columns, render
from .row_parts import answer_text, text_of, user_text

if TYPE_CHECKING:
    import pandas as pd


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
        return [text_of(v) for v in df[spec]]
    return [render(spec, record) for record in df.to_dict(orient="records")]


# An answer of this many words or more, repeated word for word between the sides, identifies a row: a model can
# have memorised it. A shorter one ("Shipping costs 22.50 EUR.") may be two different rows that happen to answer
# alike, and leaks only when its prompt also (nearly) repeats a training prompt.
IDENTIFYING_ANSWER_WORDS = 8


def overlap(train: list[dict], held: list[dict], near_prompts: list[bool] | None = None) -> dict[str, float]:
    """Leakage between the sides, as shares of the held-out rows (0.0 when nothing is held out):

    - prompt_overlap: the user prompt appears word for word in train;
    - near_prompt_overlap: it does, or it is a near-copy of a training prompt (near_prompts: one flag per held-out
      row, from the near-duplicate search; without it, as prompt_overlap);
    - answer_overlap: the reply or reference appears word for word in train (empty answers never count);
    - identifying_answer_overlap: of those, the answers that identify a row: IDENTIFYING_ANSWER_WORDS words or
      more, or with a prompt that (nearly) repeats a training one. The rest are coincidences.
    """
    keys = ("prompt_overlap", "near_prompt_overlap", "answer_overlap", "identifying_answer_overlap")
    if not held:
        return dict.fromkeys(keys, 0.0)
    prompts = {user_text(r) for r in train}
    answers = {a for a in (answer_text(r) for r in train) if a.strip()}
    exact = [user_text(r) in prompts for r in held]
    near = [e or bool(n) for e, n in zip(exact, near_prompts or exact, strict=True)]
    repeated = [bool(answer_text(r).strip()) and answer_text(r) in answers for r in held]
    identifying = [
        rep and (nr or len(answer_text(r).split()) >= IDENTIFYING_ANSWER_WORDS)
        for r, rep, nr in zip(held, repeated, near, strict=True)
    ]
    counts = (sum(exact), sum(near), sum(repeated), sum(identifying))
    return {key: round(count / len(held), 4) for key, count in zip(keys, counts, strict=True)}
