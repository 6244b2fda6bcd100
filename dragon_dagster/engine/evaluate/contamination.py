"""Contamination: evaluation rows whose words a training set holds, found by n-gram overlap as GPT-3 and
lm-evaluation-harness decontaminate (lower-cased, punctuation-stripped words; 13-grams by default). An evaluation
row is contaminated when any of its n-grams occurs in any training row. An evaluation text of fewer than n words
has no n-gram: it counts as one gram of its own length (its whole text must occur, word for word, in a training
row), and one of fewer than MIN_WORDS words is too common to mean anything and is not checked (counted as such).

The evaluation side is the small one (hundreds or thousands of rows), so its grams are the lookup table and the
training rows stream past it in chunks: memory grows with the evaluation sets and one chunk, not with the training
sets. A gram's hash is a sum of its words' hashes times a random constant per position, computed for every position
of a chunk at once with numpy, and the hash of every shorter length comes on the way (the sum after j words is the
j-gram's), so the short texts cost no extra pass. A hash that matches is then compared word for word: a collision
never reports a row."""

from __future__ import annotations

import json
import string
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

DEFAULT_N = 13  # GPT-3's and lm-eval's decontamination
MIN_WORDS = 4  # a shorter evaluation text ("yes", "42 EUR") occurs in training by coincidence, not by copying
CHUNK_WORDS = 1 << 21  # training words hashed at once: a chunk's arrays are some tens of MB
SNIPPET = 160  # characters of a row shown in the check's description and metadata
_PUNCTUATION = str.maketrans("", "", string.punctuation)
_POSITION = np.random.default_rng(13).integers(1, 2**63, size=64, dtype=np.uint64) | np.uint64(1)  # odd constants


def words(text: str) -> list[str]:
    """The text as lm-eval's janitor normalizes it: lower case, ASCII punctuation removed, split on whitespace."""
    return text.lower().translate(_PUNCTUATION).split()


def row_text(row: dict) -> str:
    """A dataset row's text as a model reads it: every turn but the system prompt (which every row shares), in the
    order of the row's columns (prompt, completion or chosen and rejected), then a prompt row's reference or a
    general-skills item's target."""
    parts: list[str] = []
    for column in ("prompt", "completion", "chosen", "rejected"):
        value = row.get(column)
        if isinstance(value, str):
            parts.append(value)
        elif isinstance(value, list):
            parts += [m["content"] for m in value if m.get("role") != "system" and isinstance(m.get("content"), str)]
    for column in ("reference", "target"):
        if row.get(column) is not None:
            parts.append(str(row[column]))
    return " ".join(part for part in parts if part)


@dataclass(frozen=True)
class Match:
    """An evaluation row that a training row contains: where each is, a snippet of each, the words they share."""

    eval_set: str
    eval_row: int
    eval_text: str
    training_set: str
    training_row: int
    training_text: str
    shared: str

    def line(self) -> str:
        return (
            f"evaluation row {self.eval_row} of {self.eval_set} ({_snippet(self.eval_text, 60)!r}) is in training row "
            f"{self.training_row} of {self.training_set}: {_snippet(self.shared, 80)!r}"
        )


@dataclass(frozen=True)
class Contamination:
    """What the check found: the contaminated rows (one match each, the first found), each set's figures, the
    rows too short to check, the gram length and the seconds it took."""

    matches: list[Match]
    checked: dict[str, int]  # evaluation set: rows checked
    contaminated: dict[str, int]  # evaluation set: rows contaminated
    too_short: dict[str, int]  # evaluation set: rows under MIN_WORDS words, not checked
    training_rows: int
    n: int
    seconds: float

    def share(self, eval_set: str) -> float:
        return self.contaminated.get(eval_set, 0) / max(self.checked.get(eval_set, 0), 1)

    def metadata(self, shown: int = 20) -> dict[str, Any]:
        rows = [
            asdict(m) | {"eval_text": _snippet(m.eval_text), "training_text": _snippet(m.training_text)}
            for m in self.matches[:shown]
        ]
        return {
            "ngram": self.n,
            "contaminated_rows": len(self.matches),
            "evaluation_rows_checked": sum(self.checked.values()),
            "too_short_to_check": sum(self.too_short.values()),
            "training_rows": self.training_rows,
            "contamination_seconds": round(self.seconds, 3),
            "by_evaluation_set": {
                name: {"checked": rows, "contaminated": self.contaminated.get(name, 0), "share": self.share(name)}
                for name, rows in self.checked.items()
            },
            **({"contaminated": rows} if rows else {}),
        }


def _snippet(text: str, limit: int = SNIPPET) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _word_hashes(tokens: list[str]) -> np.ndarray:
    # Python's string hash (SipHash): stable within the process, which is all one check needs
    return np.fromiter(map(hash, tokens), dtype=np.int64, count=len(tokens)).view(np.uint64)


def _gram_hashes(flat: np.ndarray, owner: np.ndarray, lengths: set[int]) -> Iterator[tuple[int, np.ndarray]]:
    """For each length k in lengths (ascending): (k, the hash of the k-gram starting at each position, 0 where the
    gram would run past its row's end). One pass over the positions for the longest length gives them all."""
    total = np.zeros(len(flat), dtype=np.uint64)
    size = len(flat)
    for j in range(min(max(lengths, default=0), size)):
        total[: size - j] += flat[j:] * _POSITION[j]
        k = j + 1
        if k in lengths:
            hashes = total[: size - k + 1].copy()
            hashes[owner[: size - k + 1] != owner[k - 1 :]] = 0  # the gram crosses into the next row
            yield k, hashes


class _EvalGrams:
    """The evaluation rows' grams by length: their hashes sorted (to search), and the row and start of each."""

    def __init__(self, rows: list[list[str]], n: int):
        self.by_length: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}  # k: (hashes, rows, starts)
        groups: dict[int, list[int]] = {}  # gram length: the rows checked with it (n, or a short row's own length)
        for index, tokens in enumerate(rows):
            if len(tokens) >= MIN_WORDS:
                groups.setdefault(min(n, len(tokens)), []).append(index)
        for k, members in groups.items():
            lengths = np.array([len(rows[i]) for i in members])
            flat = _word_hashes([w for i in members for w in rows[i]])
            owner = np.repeat(np.arange(len(members)), lengths)
            [(_, hashes)] = list(_gram_hashes(flat, owner, {k}))
            keep = np.flatnonzero(hashes)
            row_starts = np.cumsum(np.concatenate([[0], lengths[:-1]]))
            order = np.argsort(hashes[keep], kind="stable")
            positions = keep[order]
            self.by_length[k] = (
                hashes[positions],
                np.array(members)[owner[positions]],
                positions - row_starts[owner[positions]],
            )

    def lengths(self) -> set[int]:
        return set(self.by_length)

    def hits(self, k: int, hashes: np.ndarray) -> np.ndarray:
        """Positions whose k-gram hash is one of the evaluation grams' of that length."""
        table = self.by_length[k][0]
        at = np.minimum(np.searchsorted(table, hashes), len(table) - 1)
        return np.flatnonzero((table[at] == hashes) & (hashes != 0))

    def sources(self, k: int, value: int) -> Iterator[tuple[int, int]]:
        """The evaluation (row, start) of every gram of length k with this hash."""
        table, rows, starts = self.by_length[k]
        lo, hi = np.searchsorted(table, np.uint64(value), "left"), np.searchsorted(table, np.uint64(value), "right")
        yield from zip(rows[lo:hi].tolist(), starts[lo:hi].tolist(), strict=True)


def _chunks(rows: Iterable[tuple[int, list[str], str]]) -> Iterator[list[tuple[int, list[str], str]]]:
    """Training rows (index, words, text) in chunks of about CHUNK_WORDS words."""
    chunk, size = [], 0
    for row in rows:
        chunk.append(row)
        size += len(row[1])
        if size >= CHUNK_WORDS:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def find_contamination(
    training: dict[str, Iterable[dict]],
    evaluation: dict[str, list[dict]],
    n: int = DEFAULT_N,
    exempt: dict[str, set[str]] | None = None,
) -> Contamination:
    """Every evaluation row (by set) that shares an n-gram, or its whole text when shorter than n, with a row of a
    training set. exempt: {evaluation set: training sets it is not checked against} (a dataset's own held-out split
    against its own train is the leak check's business)."""
    started = time.perf_counter()
    exempt = exempt or {}
    names = list(evaluation)
    eval_rows = [(name, i, row_text(row)) for name in names for i, row in enumerate(evaluation[name])]
    tokens = [words(text) for _, _, text in eval_rows]
    grams = _EvalGrams(tokens, n)
    found: dict[int, Match] = {}
    training_rows = 0
    for training_set, rows in training.items():
        for chunk in _chunks((index, words(text), text) for index, row in enumerate(rows) for text in [row_text(row)]):
            training_rows += len(chunk)
            lengths = [len(t) for _, t, _ in chunk]
            flat = _word_hashes([w for _, t, _ in chunk for w in t])
            owner = np.repeat(np.arange(len(chunk)), lengths)
            starts = np.cumsum([0, *lengths[:-1]])
            for k, hashes in _gram_hashes(flat, owner, grams.lengths()):
                for position in grams.hits(k, hashes).tolist():
                    local = int(owner[position])
                    index, row_tokens, text = chunk[local]
                    offset = position - int(starts[local])
                    gram = row_tokens[offset : offset + k]
                    for eval_index, eval_start in grams.sources(k, int(hashes[position])):
                        eval_set, eval_row, eval_text = eval_rows[eval_index]
                        if eval_index in found or training_set in exempt.get(eval_set, set()):
                            continue
                        if tokens[eval_index][eval_start : eval_start + k] != gram:  # a hash collision
                            continue
                        found[eval_index] = Match(
                            eval_set, eval_row, eval_text, training_set, index, text, " ".join(gram)
                        )
    checked = {name: 0 for name in names}
    too_short = {name: 0 for name in names}
    for (name, _, _), row_tokens in zip(eval_rows, tokens, strict=True):
        (checked if len(row_tokens) >= MIN_WORDS else too_short)[name] += 1
    contaminated: dict[str, int] = {}
    for match in found.values():
        contaminated[match.eval_set] = contaminated.get(match.eval_set, 0) + 1
    return Contamination(
        matches=[found[i] for i in sorted(found)],
        checked=checked,
        contaminated=contaminated,
        too_short=too_short,
        training_rows=training_rows,
        n=n,
        seconds=time.perf_counter() - started,
    )


def read_rows(path: Path) -> Iterator[dict]:
    """A JSONL file's rows one at a time (a training set streams past the evaluation grams)."""
    with open(path) as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def skill_items(tasks: list[str]) -> tuple[dict[str, list[dict]], list[str]]:
    """The scored items of the bundled general-skills tasks a report runs, as rows (each item's prompt and its right
    answer), by task; and the tasks that cannot be read here (lm-eval tasks from the hub), which go unchecked."""
    from .general_skills import SKILLS_DIR, SUITE_TAG, local_tasks

    names = local_tasks() if SUITE_TAG in tasks else [t for t in tasks if t in local_tasks()]
    items = {}
    for task in names:
        rows = list(read_rows(SKILLS_DIR / f"{task.removeprefix('skills_')}.test.jsonl"))
        items[task] = [
            {"prompt": r["prompt"], "target": r["choices"][r["answer"]] if "choices" in r else r.get("target")}
            for r in rows
        ]
    return items, [t for t in tasks if t != SUITE_TAG and t not in local_tasks()]
