"""Text matchers: whether a generated reply matches a reference, one number per row, no model involved.

The task metrics (evaluate/metrics.py, dragon_metrics) and the verifiable rewards (rewards/) are both built on
these, so a reward scores a reply exactly as the evaluation measures it.
"""

from __future__ import annotations

import json
import re
import string
from collections import Counter
from collections.abc import Callable
from fractions import Fraction

_PUNCT = re.escape(string.punctuation)


def normalize(text: str) -> str:
    """Lower case, collapse whitespace, drop trailing punctuation."""
    text = re.sub(r"\s+", " ", str(text).strip().lower())
    return re.sub(f"[{_PUNCT}]+$", "", text).strip()


def exact(generated: str, reference: str, prompt: str = "") -> float:
    return float(normalize(generated) == normalize(reference))


def contains(generated: str, reference: str, prompt: str = "") -> float:
    ref = normalize(reference)
    return float(bool(ref) and ref in normalize(generated))


def _tokens(text: str) -> list[str]:
    return re.findall(r"\w+", str(text).lower())


def token_f1(generated: str, reference: str, prompt: str = "") -> float:
    gen, ref = _tokens(generated), _tokens(reference)
    if not gen or not ref:
        return float(gen == ref)
    common = sum((Counter(gen) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(gen), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def unfence(text: str) -> str:
    """The body of the first ``` fenced block, or the text itself."""
    match = re.search(r"```(?:[\w-]+)?\s*\n?(.*?)```", str(text), flags=re.S)
    return match.group(1).strip() if match else str(text).strip()


def json_valid(generated: str, reference: str = "", prompt: str = "") -> float:
    try:
        json.loads(unfence(generated))
        return 1.0
    except (json.JSONDecodeError, ValueError):
        return 0.0


NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")


def last_number(text: str) -> Fraction | None:
    """The last number in a text as an exact fraction: "1,000" is 1000 and "1/2" equals "0.5"."""
    found = NUMBER.findall(str(text))
    for token in reversed(found):
        token = token.replace(",", "")
        try:
            return Fraction(token)
        except (ValueError, ZeroDivisionError):
            continue
    return None


def numeric(generated: str, reference: str, prompt: str = "") -> float:
    ref = last_number(reference)
    return float(ref is not None and last_number(generated) == ref)


def length_ratio(generated: str, reference: str, prompt: str = "") -> float:
    return len(str(generated)) / max(1, len(str(reference)))


# name -> matcher(generated, reference, prompt): the task metrics a pipeline can name
MATCHERS: dict[str, Callable[[str, str, str], float]] = {
    "exact": exact,
    "contains": contains,
    "token_f1": token_f1,
    "json_valid": json_valid,
    "numeric": numeric,
    "length_ratio": length_ratio,
}
