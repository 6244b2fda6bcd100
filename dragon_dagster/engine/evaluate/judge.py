"""LLM-as-judge: rubric scores from 1 to 10, and position-debiased pairwise comparison (dragonfarm's dragon_judge).

- `Judge.score(prompts, replies, references)` asks the judge for {"score": 1-10, "reason": ...} per reply,
  using the reference answer as ground truth when there is one.
- `Judge.compare(prompts, replies_a, replies_b, references)` asks every question twice, with the two replies
  swapped. A row counts as a win or a loss only when both orders agree; when they disagree it is a tie (and
  counted in `disagreements`), so a judge that always favours the first position comes out as all ties.

Answers the judge did not give as usable JSON (judge_answers.py reads them) are counted as unparsed and left out
of every mean and rate; they are never scored as 0. Raw judge answers are cached by (backend identity, rubric, the
exact judge messages, max_new_tokens) in memory and, with `cache_path`, in a SQLite file, so a re-run costs
nothing.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..infer.backend import Backend
from ..infer.backend_registry import as_backend
from .judge_answers import parse_score, parse_winner

DEFAULT_RUBRIC = (
    "Reward replies that are correct, helpful and directly address the user's request. "
    "Penalise factual errors, made-up details, ignoring the request, and needless padding."
)

SYSTEM = (
    "You are an impartial, strict judge of AI assistant replies. Judge only by the criteria given. "
    "Always answer with a single JSON object and nothing else."
)

SCORE_TEMPLATE = """Rate the assistant reply below from 1 (useless or wrong) to 10 (excellent).

Criteria: {rubric}
{reference_block}
<user_request>
{prompt}
</user_request>

<assistant_reply>
{reply}
</assistant_reply>

Answer with only a JSON object: {{"score": <integer from 1 to 10>, "reason": "<one short sentence>"}}"""

PAIRWISE_TEMPLATE = """Two assistant replies answer the same user request. Decide which one is better.

Criteria: {rubric}
Do not let the order of the replies or their length alone decide.
{reference_block}
<user_request>
{prompt}
</user_request>

<response_1>
{first}
</response_1>

<response_2>
{second}
</response_2>

Answer with only a JSON object: {{"winner": "1" or "2" or "tie", "reason": "<one short sentence>"}}"""

REFERENCE_BLOCK = """
<reference_answer>
{reference}
</reference_answer>
Treat the reference answer as ground truth: a reply that contradicts it is wrong, however well written.
"""

VERDICTS = ("a", "b", "tie", "unparsed")


# ------------------------------------------------------------------------------------------------ results


@dataclass
class Score:
    score: float | None  # 1..10; None when the judge's answer could not be parsed
    reason: str
    raw: str

    @property
    def parsed(self) -> bool:
        return self.score is not None


def score_summary(scores: list[Score]) -> dict:
    """n, how many were scored and unparsed, and the mean over the scored ones (None when none were)."""
    values = [s.score for s in scores if s.score is not None]
    return {
        "n": len(scores),
        "scored": len(values),
        "unparsed": len(scores) - len(values),
        "mean": sum(values) / len(values) if values else None,
    }


@dataclass
class PairwiseRow:
    verdict: str  # "a", "b", "tie" or "unparsed", from A's side
    a_first: str | None  # what the judge chose with A shown first: "a", "b", "tie", None if unparsed
    b_first: str | None  # ... with B shown first, mapped back to "a"/"b"
    reason_a_first: str = ""
    reason_b_first: str = ""
    raw_a_first: str = ""
    raw_b_first: str = ""

    @property
    def disagreement(self) -> bool:
        return self.a_first is not None and self.b_first is not None and self.a_first != self.b_first


@dataclass
class PairwiseResult:
    rows: list[PairwiseRow] = field(default_factory=list)

    def _count(self, verdict: str) -> int:
        return sum(r.verdict == verdict for r in self.rows)

    @property
    def wins(self) -> int:
        return self._count("a")

    @property
    def losses(self) -> int:
        return self._count("b")

    @property
    def ties(self) -> int:
        return self._count("tie")

    @property
    def unparsed(self) -> int:
        return self._count("unparsed")

    @property
    def disagreements(self) -> int:
        return sum(r.disagreement for r in self.rows)

    @property
    def parsed(self) -> int:
        return len(self.rows) - self.unparsed

    @property
    def win_rate(self) -> float | None:
        """(wins + ties / 2) / parsed rows, from A's side; None when no row was parsed."""
        return (self.wins + 0.5 * self.ties) / self.parsed if self.parsed else None

    @property
    def verdicts(self) -> list[str]:
        return [r.verdict for r in self.rows]

    def summary(self) -> dict:
        return {
            "n": len(self.rows),
            "wins": self.wins,
            "ties": self.ties,
            "losses": self.losses,
            "unparsed": self.unparsed,
            "disagreements": self.disagreements,
            "win_rate": self.win_rate,
        }

    def to_dict(self) -> dict:
        return {"summary": self.summary(), "rows": [asdict(r) for r in self.rows]}


def combine(a_first: str | None, b_first: str | None) -> str:
    """One verdict from the two orders: agreement stands, disagreement is a tie, a missing order is unparsed."""
    if a_first is None or b_first is None:
        return "unparsed"
    return a_first if a_first == b_first else "tie"


# ------------------------------------------------------------------------------------------------ cache


class _Cache:
    """Raw judge answers by key: a dict in memory, mirrored to SQLite at `path` when given."""

    def __init__(self, path: str | Path | None):
        self.memory: dict[str, str] = {}
        self.path = Path(path).expanduser() if path else None
        self.lock = threading.Lock()
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self._connect() as db:
                db.execute(
                    "CREATE TABLE IF NOT EXISTS judge_cache (key TEXT PRIMARY KEY, backend TEXT, "
                    "answer TEXT NOT NULL, created REAL DEFAULT (julianday('now')))"
                )

    def _connect(self):
        return sqlite3.connect(self.path, timeout=30)

    def get_many(self, keys: list[str]) -> dict[str, str]:
        found = {k: self.memory[k] for k in keys if k in self.memory}
        missing = [k for k in dict.fromkeys(keys) if k not in found]
        if self.path and missing:
            with self.lock, self._connect() as db:
                for start in range(0, len(missing), 500):
                    chunk = missing[start : start + 500]
                    rows = db.execute(
                        f"SELECT key, answer FROM judge_cache WHERE key IN ({','.join('?' * len(chunk))})", chunk
                    ).fetchall()
                    found.update(rows)
            self.memory.update({k: v for k, v in found.items()})
        return found

    def put_many(self, items: dict[str, str], backend: str) -> None:
        self.memory.update(items)
        if self.path and items:
            with self.lock, self._connect() as db:
                db.executemany(
                    "INSERT OR REPLACE INTO judge_cache (key, backend, answer) VALUES (?, ?, ?)",
                    [(k, backend, v) for k, v in items.items()],
                )


# ------------------------------------------------------------------------------------------------ judge


def _render(prompt: Any) -> str:
    """A prompt as text for the judge: a string as is, a conversation as role-tagged turns."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, (list, tuple)) and all(isinstance(m, dict) for m in prompt):
        return "\n\n".join(f"{m.get('role', 'user')}: {m.get('content', '')}" for m in prompt)
    return str(prompt)


def _check_lengths(prompts: list, *columns: tuple[str, list | None]) -> None:
    for name, column in columns:
        if column is not None and len(column) != len(prompts):
            raise ValueError(f"{name} has {len(column)} items but there are {len(prompts)} prompts")


class Judge:
    """An LLM judge over any Backend (or a backend config mapping, or a model spec for a LocalBackend)."""

    def __init__(
        self,
        backend: Backend | dict | str,
        rubric: str | None = None,
        cache_path: str | Path | None = None,
        max_new_tokens: int = 256,
        *,
        system: str | None = None,
    ):
        self.backend = as_backend(backend)
        self.rubric = rubric.strip() if rubric and rubric.strip() else DEFAULT_RUBRIC
        self.max_new_tokens = max_new_tokens
        self.system = system or SYSTEM
        self.cache = _Cache(cache_path)
        self.stats = {"requests": 0, "cache_hits": 0}

    def _reference_block(self, reference: str | None) -> str:
        return REFERENCE_BLOCK.format(reference=reference) if reference not in (None, "") else ""

    def _key(self, messages: list[dict]) -> str:
        blob = json.dumps(
            [self.backend.identity, self.rubric, self.max_new_tokens, messages], sort_keys=True, ensure_ascii=False
        )
        return hashlib.sha256(blob.encode()).hexdigest()

    def ask(self, user_messages: list[str]) -> list[str]:
        """Raw judge answers to judge prompts, from the cache where possible; the rest in one backend call."""
        conversations = [
            [{"role": "system", "content": self.system}, {"role": "user", "content": m}] for m in user_messages
        ]
        keys = [self._key(c) for c in conversations]
        found = self.cache.get_many(keys)
        todo = {k: c for k, c in zip(keys, conversations) if k not in found}  # duplicates asked once
        self.stats["cache_hits"] += len(keys) - sum(k not in found for k in keys)
        if todo:
            answers = self.backend.chat(list(todo.values()), max_new_tokens=self.max_new_tokens, temperature=0.0)
            self.stats["requests"] += len(todo)
            fresh = dict(zip(todo, answers))
            self.cache.put_many(fresh, self.backend.identity)
            found.update(fresh)
        return [found[k] for k in keys]

    def score(self, prompts: list, replies: list[str], references: list[str] | None = None) -> list[Score]:
        """A 1..10 score per reply against the rubric (reference answers as ground truth when given)."""
        _check_lengths(prompts, ("replies", replies), ("references", references))
        messages = [
            SCORE_TEMPLATE.format(
                rubric=self.rubric,
                prompt=_render(p),
                reply=r,
                reference_block=self._reference_block(references[i] if references else None),
            )
            for i, (p, r) in enumerate(zip(prompts, replies))
        ]
        scores = []
        for raw in self.ask(messages):
            value, reason = parse_score(raw)
            scores.append(Score(score=value, reason=reason, raw=raw))
        return scores

    def compare(
        self, prompts: list, replies_a: list[str], replies_b: list[str], references: list[str] | None = None
    ) -> PairwiseResult:
        """A against B on every prompt, each judged twice with the replies swapped; verdicts from A's side."""
        _check_lengths(prompts, ("replies_b", replies_b), ("replies_a", replies_a), ("references", references))
        messages = []
        for i, (p, a, b) in enumerate(zip(prompts, replies_a, replies_b)):
            common = {
                "rubric": self.rubric,
                "prompt": _render(p),
                "reference_block": self._reference_block(references[i] if references else None),
            }
            messages.append(PAIRWISE_TEMPLATE.format(first=a, second=b, **common))
            messages.append(PAIRWISE_TEMPLATE.format(first=b, second=a, **common))
        raws = self.ask(messages)
        rows = []
        for raw_a_first, raw_b_first in zip(raws[0::2], raws[1::2]):
            w1, reason1 = parse_winner(raw_a_first)
            w2, reason2 = parse_winner(raw_b_first)
            a_first = {"1": "a", "2": "b", "tie": "tie"}.get(w1) if w1 else None
            b_first = {"1": "b", "2": "a", "tie": "tie"}.get(w2) if w2 else None
            rows.append(
                PairwiseRow(
                    verdict=combine(a_first, b_first),
                    a_first=a_first,
                    b_first=b_first,
                    reason_a_first=reason1,
                    reason_b_first=reason2,
                    raw_a_first=raw_a_first,
                    raw_b_first=raw_b_first,
                )
            )
        return PairwiseResult(rows=rows)
