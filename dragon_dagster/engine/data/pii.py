"""Personal data in training rows: e-mail addresses, phone numbers, card numbers and IP addresses found by
presidio-analyzer's pattern recognisers, and each stage's answer to them (`pii: warn | redact | block`).

The recognisers are presidio's own (EmailRecognizer, PhoneRecognizer over the phonenumbers library,
CreditCardRecognizer with its Luhn checksum, IpRecognizer), each called without an NLP engine: no spaCy model is
installed (nor downloadable offline), so what needs one is not looked for, names and places above all
(`NOT_DETECTED`, recorded in every report). The e-mail recogniser checks the domain with tldextract, here
with its bundled suffix list: never a download of the public one.

Speed: presidio runs each recogniser over every text it is given (phone numbers cost about 2 ms per candidate
number: eight regions, each parsed by phonenumbers), so a text reaches a recogniser only when a cheap regex says
it may hold that entity (`PREFILTERS`), phonenumbers sees only the phone-shaped runs of a text with a few
characters around them (`phone_windows`), each distinct text is scanned once, and presidio is imported only when a
text needs it. The prefilters are necessary conditions of presidio's patterns, except the phone one, which asks
for 7 digits (the shortest number of most of presidio's regions) not starting an ISO date: shorter numbers are not
looked for.
"""

from __future__ import annotations

import functools
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, Literal

from ..artifacts.manifest import PiiFinding, PiiReport

PiiMode = Literal["warn", "redact", "block"]

ENTITIES = ("EMAIL_ADDRESS", "PHONE_NUMBER", "CREDIT_CARD", "IP_ADDRESS")
# presidio finds these with an NER model (spaCy, transformers), which this scan has not
NOT_DETECTED = ("PERSON", "LOCATION", "NRP", "DATE_TIME")
MIN_SCORE = 0.3  # presidio's own scores: below it only IpRecognizer's bare "::" (0.1), which is no address
MAX_FINDINGS = 20  # findings a report names (the counts cover all)
CONTEXT = 20  # characters either side of a finding in its masked snippet

_DATE = r"(?:19|20)\d\d-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])\b"  # ISO, the form tickets hold
PREFILTERS = {
    "EMAIL_ADDRESS": re.compile(r"@\w"),  # the pattern's "@" then a domain
    "CREDIT_CARD": re.compile(r"\d{4}[- ]?\d{3}"),  # the pattern's first two groups of digits
    "IP_ADDRESS": re.compile(r"\d\.\d{1,3}\.\d|:[0-9A-Fa-f]{0,4}:"),  # IPv4's dots, IPv6's two colons
    # 7 digits or more with a phone's separators, not starting a date: the whole run, which its window holds
    "PHONE_NUMBER": re.compile(r"(?<!\d)(?!" + _DATE + r")\d(?:[\s().\-/]{0,2}\d){6,}"),
}
# phone-shaped runs that are another entity, which phonenumbers would parse at length to no avail (an IPv4
# address: valid to it in some regions, but the IP recogniser's, with a higher score; a card's four groups of four)
_NOT_PHONE = re.compile(r"\d{1,3}(?:\.\d{1,3}){3}|\d{4}([- ]?)\d{4}\1\d{4}\1\d{4}")
# an identifier's digits: a run of digits alone glued to a letter before it ("case C0001234", "ORD4155550123"), which
# phonenumbers never takes for a number (at its VALID leniency, presidio's, a candidate after a Latin letter is
# refused); with separators or a lead character ("A+1 415 555 0134") the run is still looked at
_IDENTIFIER_DIGITS = re.compile(r"\d+")
WINDOW = 8  # characters either side of a phone-shaped run that phonenumbers sees (a leading +, a bracket)
# keys of a row's structure whose values are never personal data (a turn's role, a tool call's name and id); a tool
# call's arguments are the caller's own keys, all scanned
_SKIP_KEYS = frozenset({"role", "type", "name", "id", "tool_call_id", "label"})


def candidates(text: str) -> list[str]:
    """The entities a text may hold, by the prefilters (the scan asks presidio only for these)."""
    return [e for e in ENTITIES if PREFILTERS[e].search(text)]


def phone_windows(text: str) -> list[tuple[int, int]]:
    """Where phone numbers may be: each phone-shaped run with WINDOW characters either side, overlaps merged.
    phonenumbers parses every number-like run of what it is given, eight regions each (an order number, a date:
    about 2 ms a run), so it is given these windows, not the whole text."""
    windows: list[tuple[int, int]] = []
    for m in PREFILTERS["PHONE_NUMBER"].finditer(text):
        if _NOT_PHONE.fullmatch(m.group().strip()) or identifier_digits(text, m):
            continue
        lo, hi = max(0, m.start() - WINDOW), min(len(text), m.end() + WINDOW)
        if windows and lo <= windows[-1][1]:
            windows[-1] = (windows[-1][0], hi)
        else:
            windows.append((lo, hi))
    return windows


def identifier_digits(text: str, run: re.Match) -> bool:
    """Whether a phone-shaped run is digits alone right after an ASCII letter: part of an identifier, not a number
    phonenumbers would find (support tickets carry one in every reply: a case or order number)."""
    before = text[run.start() - 1] if run.start() else ""
    return bool(_IDENTIFIER_DIGITS.fullmatch(run.group())) and before.isascii() and before.isalpha()


@functools.cache
def recognizers() -> dict:
    """presidio's pattern recognisers by the entity each finds (imported on first use: presidio's import pulls
    spaCy, about 2 CPU seconds). Each is called directly, with no NLP engine: an AnalyzerEngine over a no-op one adds
    about 1 ms a call (an empty spaCy Doc, context enhancement that has no tokens to use) and nothing else here."""
    import tldextract

    # presidio's package imports its Hugging Face NER engine, which imports transformers' pipelines (and with them
    # torch's compiler and distributed packages: 5 of presidio's 7 CPU seconds of import) for an NER path this scan
    # never takes. It imports them under `except ImportError`, so for the length of its import they are missing
    # (None in sys.modules is Python's "not importable"); a process that has them already keeps them.
    missing = "transformers.pipelines" not in sys.modules
    if missing:
        sys.modules["transformers.pipelines"] = None
    try:
        from presidio_analyzer.predefined_recognizers import (
            CreditCardRecognizer,
            EmailRecognizer,
            IpRecognizer,
            PhoneRecognizer,
        )
    finally:
        if missing and sys.modules.get("transformers.pipelines", 0) is None:
            del sys.modules["transformers.pipelines"]

    # the default extractor fetches the public suffix list on first use: offline that waits for a timeout
    suffixes = tldextract.TLDExtract(cache_dir=None, suffix_list_urls=())

    class OfflineEmailRecognizer(EmailRecognizer):
        def validate_result(self, pattern_text: str) -> bool:
            return suffixes(pattern_text).fqdn != ""

    found = [OfflineEmailRecognizer(), PhoneRecognizer(), CreditCardRecognizer(), IpRecognizer()]
    return {r.supported_entities[0]: r for r in found}


Span = tuple[int, int, str]  # start, end, entity type


def find(text: str) -> list[Span]:
    """The personal data in a text: non-overlapping spans in order (of two that overlap, the longer is kept, then
    the likelier: an IPv4 address is also a valid phone number to phonenumbers)."""
    wanted = candidates(text)
    if not wanted:
        return []
    by_entity, found = recognizers(), []
    for entity in wanted:
        where = phone_windows(text) if entity == "PHONE_NUMBER" else [(0, len(text))]
        for lo, hi in where:
            results = by_entity[entity].analyze(text[lo:hi], [entity], None)
            found += [(lo + r.start, lo + r.end, r.entity_type, r.score) for r in results if r.score >= MIN_SCORE]
    spans: list[Span] = []
    for start, end, entity, _ in sorted(found, key=lambda f: (f[0], f[0] - f[1], -f[3])):
        if not spans or start >= spans[-1][1]:
            spans.append((start, end, entity))
    return spans


def redact(text: str, spans: list[Span]) -> str:
    """The text with each span replaced by its placeholder, `<EMAIL_ADDRESS>` style."""
    for start, end, entity in reversed(spans):
        text = f"{text[:start]}<{entity}>{text[end:]}"
    return text


def shape(value: str) -> str:
    """A value with its letters as x and its digits as 9: its form shows (a false positive can be told), the
    data does not."""
    return "".join("9" if c.isdigit() else "x" if c.isalpha() else c for c in value)


def snippet(text: str, spans: list[Span], i: int) -> str:
    """The text around span i, every span in it masked (shape)."""
    lo, hi = max(0, spans[i][0] - CONTEXT), min(len(text), spans[i][1] + CONTEXT)
    out, at = [], lo
    for start, end, _ in spans:
        if end <= lo or start >= hi:
            continue
        out += [text[at : max(at, start)], shape(text[max(start, lo) : min(end, hi)])]
        at = min(end, hi)
    out.append(text[at:hi])
    return ("…" if lo else "") + "".join(out).replace("\n", " ") + ("…" if hi < len(text) else "")


_NONE: list[Span] = []


class Scan:
    """One scan: every distinct text analysed once, the counts and the first findings kept."""

    def __init__(self, mode: PiiMode, unit: str = "row"):
        self.mode, self.unit = mode, unit
        self.cache: dict[str, list[Span]] = {}
        self.counts: Counter[str] = Counter()
        self.findings: list[PiiFinding] = []
        self.rows = self.rows_with_pii = self.redacted = 0
        self.started = time.perf_counter()

    def spans(self, text: str) -> list[Span]:
        if text not in self.cache:
            self.cache[text] = find(text) or _NONE  # one empty list for the many clean texts
        return self.cache[text]

    def row(self, value: Any, row: int, source: str | None = None) -> Any:
        """A row (or a feedback record) scanned: every text in it, its turns' contents and tool calls' arguments
        included; returned redacted in redact mode, else as it was."""
        self.rows += 1
        hits = 0

        def visit(item: Any, field: str, arguments: bool = False) -> Any:
            nonlocal hits
            if isinstance(item, str):
                spans = self.spans(item)
                if not spans:
                    return item
                hits += len(spans)
                for i, (_, _, entity) in enumerate(spans):
                    self.counts[entity] += 1
                    if len(self.findings) < MAX_FINDINGS:
                        self.findings.append(
                            PiiFinding(
                                row=row, source=source, field=field, entity=entity, snippet=snippet(item, spans, i)
                            )
                        )
                if self.mode != "redact":
                    return item
                self.redacted += len(spans)
                return redact(item, spans)
            if isinstance(item, dict):
                return {
                    k: v if k in _SKIP_KEYS and not arguments else visit(v, field or k, arguments or k == "arguments")
                    for k, v in item.items()
                }
            if isinstance(item, list):
                return [visit(v, field, arguments) for v in item]
            return item

        out = visit(value, "")
        self.rows_with_pii += bool(hits)
        return out if self.mode == "redact" else value

    def report(self) -> PiiReport:
        return PiiReport(
            mode=self.mode,
            unit=self.unit,
            rows_scanned=self.rows,
            rows_with_pii=self.rows_with_pii,
            counts=dict(sorted(self.counts.items())),
            redacted=self.redacted,
            findings=self.findings,
            detected=list(ENTITIES),
            not_detected=list(NOT_DETECTED),
            seconds=round(time.perf_counter() - self.started, 3),
        )


# the fields of a mapped row that reach training: its turns, replies and reference (not its tool schemas)
ROW_FIELDS = ("prompt", "completion", "chosen", "rejected", "reference")


def scan_rows(
    rows: list[dict], mode: PiiMode, where: Iterable[tuple[str | None, int]] | None = None
) -> tuple[list[dict], PiiReport]:
    """(the rows, redacted in redact mode, and what was found). where: each row's (source label, row index) as
    findings name it; default its position."""
    scan, out = Scan(mode), []
    places = list(where) if where is not None else [(None, i) for i in range(len(rows))]
    for row, (source, index) in zip(rows, places, strict=True):
        scanned = scan.row({k: row[k] for k in ROW_FIELDS if k in row}, index, source)
        out.append({**row, **scanned} if mode == "redact" else row)
    return out, scan.report()


def scan_records(records: list[dict], mode: PiiMode, fields: tuple[str, ...] = ("turns", "reply", "edited")):
    """Feedback records scanned like rows (named by record id): (the records, redacted in redact mode, the
    report)."""
    scan, out = Scan(mode, unit="record"), []
    for i, record in enumerate(records):
        scanned = scan.row({k: record[k] for k in fields if k in record}, record.get("id", i))
        out.append({**record, **scanned} if mode == "redact" else record)
    return out, scan.report()


def redactor(mode: PiiMode) -> Callable[[str], str]:
    """A text redacted as a scan in this mode would (unchanged unless redact): for what is written beside the
    rows (a feedback dataset's records.json)."""
    if mode != "redact":
        return lambda text: text
    return lambda text: redact(text, find(text)) if isinstance(text, str) else text
