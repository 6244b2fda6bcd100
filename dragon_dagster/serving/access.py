"""Who may call the server and how much: API keys kept only as hashes, and a per-key limit on requests and
tokens per minute.

Keys come from `DRAGON_SERVE_KEYS` (entries separated by commas or new lines) or a file (`--keys-file`, one
entry a line, `#` comments), each entry `NAME:KEY` or `NAME:sha256:HEX` (the hash `dragon serve-key` prints, so
the key itself need never be written down on the server), optionally followed by the key's own limits,
`rpm=N tpm=N` (requests and tokens per minute; the server's options otherwise). Only hashes are kept in
memory; a request's key is hashed and compared in constant time; a key is never printed or logged, only its
name. With no key configured
the server is open, says so in its first log line, and limits each client address instead.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from .protocol import ServeError

KEYS_ENV = "DRAGON_SERVE_KEYS"
WINDOW_S = 60.0


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    return "sk-dragon-" + secrets.token_urlsafe(24)


@dataclass(frozen=True)
class Key:
    name: str
    requests_per_minute: int | None = None  # None: the server's limit
    tokens_per_minute: int | None = None


def _own_limits(words: list[str], number: int, where: str) -> dict:
    limits = {}
    for word in words:
        option, _, value = word.partition("=")
        field_name = {"rpm": "requests_per_minute", "tpm": "tokens_per_minute"}.get(option)
        if field_name is None or not value.isdigit():
            raise ValueError(f"entry {number} of {where}: limits are rpm=N and tpm=N after the key")
        limits[field_name] = int(value)
    return limits


def parse_entries(text: str, where: str) -> dict[str, Key]:
    """{hash: key} from `NAME:KEY` / `NAME:sha256:HEX` entries (and their limits); a malformed one is an error
    naming its place (never its text, which may hold a key)."""
    found: dict[str, Key] = {}
    lines = [e.strip() for line in text.splitlines() for e in line.split(",")]
    for number, entry in enumerate(lines, 1):
        if not entry or entry.startswith("#"):
            continue
        entry, *words = entry.split()
        limits = _own_limits(words, number, where)
        name, sep, secret = entry.partition(":")
        if not sep or not name.strip() or not secret.strip():
            raise ValueError(f"entry {number} of {where} is not NAME:KEY or NAME:sha256:HEX")
        secret = secret.strip()
        if secret.startswith("sha256:"):
            hexed = secret.removeprefix("sha256:").lower()
            if len(hexed) != 64 or any(c not in "0123456789abcdef" for c in hexed):
                raise ValueError(f"entry {number} of {where} ({name.strip()}): sha256: must be 64 hex digits")
            found[hexed] = Key(name.strip(), **limits)
        else:
            found[digest(secret)] = Key(name.strip(), **limits)
    return found


@dataclass
class Keys:
    hashes: dict[str, Key] = field(default_factory=dict)  # sha256 hex -> the key

    @classmethod
    def load(cls, keys_file: str | Path | None = None) -> Keys:
        hashes = parse_entries(os.environ.get(KEYS_ENV, ""), f"${KEYS_ENV}")
        if keys_file:
            path = Path(keys_file).expanduser()
            try:
                text = path.read_text()
            except OSError as exc:
                raise ValueError(f"cannot read the keys file {path}: {exc.strerror}") from None
            hashes.update(parse_entries(text, str(path)))
        return cls(hashes)

    @property
    def open(self) -> bool:
        return not self.hashes

    def who(self, authorization: str | None, client: str) -> str:
        """The caller's name: the key's, or (open server) the client's address. 401 for a missing or wrong key."""
        return self.key(authorization, client).name

    def key(self, authorization: str | None, client: str) -> Key:
        """The caller's key (open server: one made for the client's address). 401 for a missing or wrong key."""
        if self.open:
            return Key(f"client {client}")
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ServeError(401, "no API key: send the header Authorization: Bearer YOUR_KEY", None, "missing_api_key")
        hashed = digest(token.strip())
        for known, key in self.hashes.items():
            if hmac.compare_digest(known, hashed):
                return key
        raise ServeError(401, "the API key is not one this server knows", None, "invalid_api_key")


@dataclass
class Limits:
    """Per caller, over the last minute: requests and tokens (prompt and reply). 0: no limit."""

    requests_per_minute: int = 0
    tokens_per_minute: int = 0
    _requests: dict[str, deque] = field(default_factory=dict)
    _tokens: dict[str, deque] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @staticmethod
    def _trim(events: deque, now: float) -> None:
        while events and events[0][0] <= now - WINDOW_S:
            events.popleft()

    def admit(self, key: Key, prompt_tokens: int) -> None:
        """Count one request of `prompt_tokens` for `key`, or refuse it (429 with Retry-After)."""
        who = key.name
        rpm = self.requests_per_minute if key.requests_per_minute is None else key.requests_per_minute
        tpm = self.tokens_per_minute if key.tokens_per_minute is None else key.tokens_per_minute
        now = time.monotonic()
        with self._lock:
            requests = self._requests.setdefault(who, deque())
            tokens = self._tokens.setdefault(who, deque())
            self._trim(requests, now)
            self._trim(tokens, now)
            if rpm and len(requests) >= rpm:
                self._refuse(requests, now, f"{rpm} requests per minute", "requests")
            used = sum(n for _, n in tokens)
            if tpm and used + prompt_tokens > tpm:
                self._refuse(tokens, now, f"{tpm} tokens per minute", "tokens")
            requests.append((now, 1))
            tokens.append((now, prompt_tokens))

    def spent(self, who: str, completion_tokens: int) -> None:
        with self._lock:
            self._tokens.setdefault(who, deque()).append((time.monotonic(), completion_tokens))

    @staticmethod
    def _refuse(events: deque, now: float, limit: str, code: str) -> None:
        wait = max(1, int(events[0][0] + WINDOW_S - now + 0.999)) if events else 1
        raise ServeError(
            429,
            f"rate limit reached: {limit} for this key; try again in {wait} s",
            None,
            f"rate_limit_{code}",
            {"Retry-After": str(wait)},
        )
