"""Contamination: evaluation rows that a training set holds, found by n-gram overlap as GPT-3 and
lm-evaluation-harness decontaminate (lower-cased, punctuation-stripped words; 13-grams by default). The runs of n
words an evaluation row shares with training rows cover some share of its words; at DIRTY_SHARE or more (Llama 2's
"dirty" sample) the row is contaminated. GPT-3 flagged a row on any shared run (share 0 here) and ignored runs found
in many training documents; on templated data (support replies that open and sign off alike) any run flags nearly
every row, while a row that was trained on is covered whole. An evaluation text of fewer than n words has no n-gram:
it counts as one gram of its own length (its whole text must occur, word for word, in a training row), and one of
fewer than MIN_WORDS words is too common to mean anything and is not checked (counted as such).

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
BITMAP = 1 << 22  # bits of an evaluation gram length's prefilter (4 MB): few false candidates for 100,000 grams
DIRTY_SHARE = 0.8  # of an evaluation row's words in runs shared with training: Llama 2's "dirty" sample
CHUNK_WORDS = 1 << 18  # training words hashed at once: their Python strings are some tens of MB
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
    rows too short to check, the settings and the seconds it took."""

    matches: list[Match]
    checked: dict[str, int]  # evaluation set: rows checked
    contaminated: dict[str, int]  # evaluation set: rows contaminated
    too_short: dict[str, int]  # evaluation set: rows under MIN_WORDS words, not checked
    training_rows: int
    n: int
    dirty_share: float  # of a row's words covered by shared runs, from which it counts
    seconds: float

    def share(self, eval_set: str) -> float:
        """Of an evaluation set's checked rows, the share contaminated."""
        return self.contaminated.get(eval_set, 0) / max(self.checked.get(eval_set, 0), 1)

    def metadata(self, shown: int = 20) -> dict[str, Any]:
        rows = [
            asdict(m) | {"eval_text": _snippet(m.eval_text), "training_text": _snippet(m.training_text)}
            for m in self.matches[:shown]
        ]
        return {
            "ngram": self.n,
            "dirty_share": self.dirty_share,
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
    """The evaluation rows' grams by length k: the distinct hashes sorted (to search), and for each gram of each row
    its hash's place among them (inverse), its row and its start."""

    def __init__(self, rows: list[list[str]], n: int):
        self.rows = rows
        self.bitmaps: dict[int, np.ndarray] = {}
        self.by_length: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
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
            table, inverse = np.unique(hashes[keep], return_inverse=True)
            row_starts = np.cumsum(np.concatenate([[0], lengths[:-1]]))
            self.by_length[k] = (table, inverse, np.array(members)[owner[keep]], keep - row_starts[owner[keep]])

    def lengths(self) -> set[int]:
        return set(self.by_length)

    def hits(self, k: int, hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The positions whose k-gram hash is an evaluation gram's, and that hash's place in the table. A bitmap of
        the table's low bits rules out nearly every position first (one lookup each), so only a few are searched."""
        table = self.by_length[k][0]
        if k not in self.bitmaps:
            self.bitmaps[k] = np.zeros(BITMAP, dtype=bool)
            self.bitmaps[k][table & np.uint64(BITMAP - 1)] = True
        candidates = np.flatnonzero(self.bitmaps[k][hashes & np.uint64(BITMAP - 1)])
        at = np.minimum(np.searchsorted(table, hashes[candidates]), len(table) - 1)
        found = (table[at] == hashes[candidates]) & (hashes[candidates] != 0)
        return candidates[found], at[found]

    def words_of(self, k: int, entry: int) -> list[str]:
        """The words of the evaluation gram with this place in the table (the first such gram's)."""
        _, inverse, rows, starts = self.by_length[k]
        first = int(np.argmax(inverse == entry))
        return self.rows[int(rows[first])][int(starts[first]) : int(starts[first]) + k]


@dataclass
class _Seen:
    """Of one training set: for each evaluation gram (by length, then place in the table), how many of its rows
    hold it, and the first of them (row, text, the words, checked word for word)."""

    rows: dict[int, np.ndarray]
    first: dict[tuple[int, int], tuple[int, str, str]]


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


def _scan(grams: _EvalGrams, rows: Iterable[dict]) -> tuple[_Seen, int]:
    """One training set streamed past the evaluation grams; returns what it holds of them and its row count."""
    seen = _Seen({k: np.zeros(len(table), dtype=np.int64) for k, (table, *_) in grams.by_length.items()}, {})
    count = 0
    for chunk in _chunks((index, words(text), text) for index, row in enumerate(rows) for text in [row_text(row)]):
        count += len(chunk)
        lengths = [len(t) for _, t, _ in chunk]
        flat = _word_hashes([w for _, t, _ in chunk for w in t])
        owner = np.repeat(np.arange(len(chunk)), lengths)
        starts = np.cumsum([0, *lengths[:-1]])
        for k, hashes in _gram_hashes(flat, owner, grams.lengths()):
            positions, entries = grams.hits(k, hashes)
            if not len(positions):
                continue
            # each training row counts once per gram, however often it repeats it
            pairs = np.unique(entries * len(chunk) + owner[positions])
            seen.rows[k] += np.bincount(pairs // len(chunk), minlength=len(seen.rows[k]))
            for position, entry in zip(positions.tolist(), entries.tolist(), strict=True):
                if (k, entry) in seen.first:
                    continue
                local = int(owner[position])
                index, row_tokens, text = chunk[local]
                gram = row_tokens[position - int(starts[local]) : position - int(starts[local]) + k]
                if gram == grams.words_of(k, entry):  # else a hash collision: never reported
                    seen.first[(k, entry)] = (index, text, " ".join(gram))
    return seen, count


def find_contamination(
    training: dict[str, Iterable[dict]],
    evaluation: dict[str, list[dict]],
    n: int = DEFAULT_N,
    exempt: dict[str, set[str]] | None = None,
    share: float = DIRTY_SHARE,
) -> Contamination:
    """Every evaluation row (by set) contaminated by a training set: the runs of n words it shares with training rows
    (its whole text, when shorter than n) cover at least `share` of its words. 0 is GPT-3's rule (any shared run);
    the default is Llama 2's "dirty" sample: a shared greeting or sign-off covers a small share of a row, a row
    trained on covers all of it. exempt: {evaluation set: training sets it is not checked against} (a dataset's own
    held-out split against its own train is the leak check's business)."""
    started = time.perf_counter()
    exempt = exempt or {}
    names = list(evaluation)
    eval_rows = [(name, i, row_text(row)) for name in names for i, row in enumerate(evaluation[name])]
    tokens = [words(text) for _, _, text in eval_rows]
    grams = _EvalGrams(tokens, n)
    seen: dict[str, _Seen] = {}
    training_rows = 0
    for training_set, rows in training.items():
        seen[training_set], count = _scan(grams, rows)
        training_rows += count
    found: dict[int, Match] = {}
    set_of_row = np.array([names.index(name) for name, _, _ in eval_rows], dtype=np.int64)
    for k, (_, inverse, rows_of, starts) in grams.by_length.items():  # rows_of ascends: a row's grams are together
        sets_of = set_of_row[rows_of]
        held = np.zeros(len(inverse), dtype=np.int64)  # of each gram, the training rows that hold it (not exempt)
        for name, of_set in seen.items():
            counted = ~np.isin(sets_of, [names.index(e) for e in names if name in exempt.get(e, set())])
            held += of_set.rows[k][inverse] * counted
        for eval_index in np.unique(rows_of[held > 0]).tolist():
            lo, hi = np.searchsorted(rows_of, eval_index, "left"), np.searchsorted(rows_of, eval_index, "right")
            shared = starts[lo:hi][held[lo:hi] > 0]
            covered = np.zeros(len(tokens[eval_index]) + 1, dtype=np.int64)  # +1 where a shared run starts, -1 after
            np.add.at(covered, shared, 1)
            np.add.at(covered, shared + k, -1)
            if (np.cumsum(covered[:-1]) > 0).mean() < share:
                continue
            eval_set, eval_row, eval_text = eval_rows[eval_index]
            against = [name for name in seen if name not in exempt.get(eval_set, set())]
            for entry in inverse[lo:hi][held[lo:hi] > 0].tolist():
                first = next(
                    (seen[name].first[(k, entry)] + (name,) for name in against if (k, entry) in seen[name].first), None
                )
                if first is not None:  # else every match was a hash collision
                    index, text, shared_words, name = first
                    found[eval_index] = Match(eval_set, eval_row, eval_text, name, index, text, shared_words)
                    break
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
        dirty_share=share,
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
