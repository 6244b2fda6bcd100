"""A judge's answer read back: the JSON object in whatever it wrote, its score from 1 to 10, its pairwise winner.

Small judges wrap their JSON in prose or fences, write Python-style dicts, name the fields loosely ("rating",
"verdict") or put the score in words ("8/10"): each is read where it is unambiguous, and anything else is None
(unparsed), never a guess.
"""

from __future__ import annotations

import ast
import json
import math
import re
from typing import Any

from ..text.matchers import unfence


def _balanced_objects(text: str, limit: int = 64):
    """Every balanced {...} substring, by start position (double-quoted strings and escapes respected)."""
    starts = [i for i, ch in enumerate(text) if ch == "{"][:limit]
    for start in starts:
        depth, in_string, escaped = 0, False, False
        for i in range(start, len(text)):
            ch = text[i]
            if in_string:
                if escaped:
                    escaped = False
                elif ch == "\\":
                    escaped = True
                elif ch == '"':
                    in_string = False
            elif ch == '"':
                in_string = True
            elif ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    yield text[start : i + 1]
                    break


def _as_dict(candidate: str) -> dict | None:
    candidate = candidate.strip()
    if not candidate.startswith("{"):
        return None
    try:
        value = json.loads(candidate)
    except ValueError:
        try:  # Python-style dicts ('single quotes', True/None) that small judges like to write
            value = ast.literal_eval(candidate)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return None
    return value if isinstance(value, dict) else None


def parse_json_answer(text: Any) -> dict | None:
    """The JSON object in a judge's answer, or None: the whole text, a ```json fenced block, or else the first
    balanced {...} object that parses (leading and trailing prose ignored)."""
    if not isinstance(text, str) or "{" not in text:
        return None
    for candidate in (text, unfence(text)):
        parsed = _as_dict(candidate)
        if parsed is not None:
            return parsed
    for candidate in _balanced_objects(text):
        parsed = _as_dict(candidate)
        if parsed is not None:
            return parsed
    return None


def _field(answer: dict, names: tuple[str, ...]) -> Any:
    lowered = {str(k).strip().lower(): v for k, v in answer.items()}
    for name in names:
        if name in lowered:
            return lowered[name]
    return None


_SCORE_TEXT = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(?:/\s*10|out of 10)?\s*$", re.I)


def parse_score(text: str) -> tuple[float | None, str]:
    """(score in 1..10 or None, reason) from a judge answer; a score out of range or not a number is None."""
    answer = parse_json_answer(text)
    if answer is None:
        return None, ""
    reason = _field(answer, ("reason", "reasoning", "explanation", "rationale"))
    reason = "" if reason is None else str(reason)
    value = _field(answer, ("score", "rating", "grade"))
    if isinstance(value, bool) or value is None:
        return None, reason
    if isinstance(value, str):
        match = _SCORE_TEXT.match(value)
        if not match:
            return None, reason
        value = match.group(1)
    try:
        score = float(value)
    except (TypeError, ValueError):
        return None, reason
    if not math.isfinite(score) or not 1 <= score <= 10:
        return None, reason
    return score, reason


_FIRST = {"1", "response 1", "response_1", "reply 1", "first", "a", "assistant 1", "[1]"}
_SECOND = {"2", "response 2", "response_2", "reply 2", "second", "b", "assistant 2", "[2]"}
_TIE = {"tie", "draw", "equal", "both", "neither", "none", "same"}


def parse_winner(text: str) -> tuple[str | None, str]:
    """("1" | "2" | "tie" or None, reason) from a pairwise judge answer."""
    answer = parse_json_answer(text)
    if answer is None:
        return None, ""
    reason = _field(answer, ("reason", "reasoning", "explanation", "rationale"))
    reason = "" if reason is None else str(reason)
    value = _field(answer, ("winner", "better", "choice", "verdict", "preferred"))
    if value is None or isinstance(value, bool):
        return None, reason
    label = str(value).strip().strip("\"'.").lower()
    if label in _FIRST:
        return "1", reason
    if label in _SECOND:
        return "2", reason
    if label in _TIE:
        return "tie", reason
    return None, reason
