"""Verifiable rewards for GRPO, as dragon_reward() defines them.

A reward scores one completion between 0 and 1 by checking a fact about the text (a number, a format, a length,
a test that passes) rather than asking a model's opinion. A `RewardSet` sums its rewards by weight; each reward
has a name, which labels its progress column (`reward_<name>`) and its evaluation score.

Types: exact, contains, numeric (compare with the row's reference), regex, json, length, keyword, command (runs
an argv, never a shell) and custom (a Python file defining `reward(prompt, completion, reference, row)`, which
returns a number; it is imported and run only in the worker process, with the user's rights, each call limited
to `timeout` seconds). `trl_reward_funcs()` adapts a set to TRL's GRPOTrainer; pass `RewardSet.weights()` as
`GRPOConfig.reward_weights` so TRL does the weighting and logs each reward as `rewards/<name>/mean`.

Framework-free: stdlib only, plus the text helpers of `metrics`, so scoring matches evaluation exactly.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from importlib.machinery import SourceFileLoader
from importlib.util import module_from_spec, spec_from_loader
from pathlib import Path
from statistics import mean
from typing import Any

from .evaluate.metrics import contains, exact, last_number, numeric, unfence

COMPLETION_FILE = "{completion_file}"
NEEDS_REFERENCE = ("exact", "contains", "numeric")
# How checks and reports read a reward: accuracy-like ones score right or wrong (their mean is a share);
# format-like ones shape the reply, and rising while accuracy falls is the mark of reward hacking.
ACCURACY_TYPES = ("exact", "contains", "numeric", "command", "custom")
FORMAT_TYPES = ("regex", "json", "length", "keyword")
# The options each type takes; from_dict rejects the others, so a YAML typo fails instead of being ignored.
OPTIONS: dict[str, tuple[str, ...]] = {
    "exact": (),
    "contains": (),
    "numeric": (),
    "regex": ("pattern", "case_sensitive"),
    "json": ("keys",),
    "length": ("min_chars", "max_chars"),
    "keyword": ("words", "mode"),
    "command": ("command", "input", "score_from", "min_score", "max_score", "timeout"),
    "custom": ("file", "fn", "timeout"),
}
_STDOUT_TAIL = 64 * 1024  # only the last number on stdout matters; keep memory flat however much is printed
_TRL_EXTRAS = {"trainer_state", "log_extra", "log_metric", "environments"}  # TRL kwargs that are not columns


class RewardError(ValueError):
    """A reward is misconfigured, cannot score a row, or does not fit the dataset."""


@dataclass
class Reward:
    """One verifiable reward. Only the options of its `type` matter (see OPTIONS)."""

    type: str
    weight: float = 1.0
    name: str | None = None
    pattern: str | None = None
    case_sensitive: bool = False
    keys: list[str] | None = None
    min_chars: int | None = None
    max_chars: int | None = None
    words: list[str] | None = None
    mode: str = "any"
    command: list[str] | None = None
    input: str = "stdin"
    score_from: str = "exit_code"
    min_score: float = 0.0
    max_score: float = 1.0
    timeout: float = 30.0
    file: str | None = None
    fn: str = "reward"
    _compiled: re.Pattern | None = field(default=None, init=False, repr=False, compare=False)
    _function: Callable | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.type not in OPTIONS:
            raise RewardError(f"unknown reward type {self.type!r}; known: {', '.join(OPTIONS)}")
        if self.name is None:
            self.name = self.type
        if not isinstance(self.name, str) or not self.name.strip():
            raise RewardError(f"reward {self.type!r}: name must be a non-empty string")
        self.weight = self._number(self.weight, "weight", minimum=0)
        getattr(self, f"_validate_{self.type}", lambda: None)()

    # -- validation, one method per type that has options (mirrors dragon_reward() in R) --

    def _fail(self, problem: str) -> RewardError:
        return RewardError(f"reward {self.name!r} ({self.type}): {problem}")

    def _number(self, value: Any, what: str, minimum: float | None = None, integer: bool = False) -> Any:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not ok or (integer and not float(value).is_integer()) or (minimum is not None and value < minimum):
            kind = "a whole number" if integer else "a number"
            raise self._fail(
                f"{what} must be {kind}" + (f" >= {minimum}" if minimum is not None else "") + f", got {value!r}"
            )
        return int(value) if integer else float(value)

    def _strings(self, value: Any, what: str) -> list[str]:
        # A lone string means one item, as a length-1 character vector does in R.
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)) or not items or not all(isinstance(s, str) and s for s in items):
            raise self._fail(f"needs {what}: a non-empty list of non-empty strings, got {value!r}")
        return list(items)

    def _choice(self, value: Any, what: str, choices: tuple[str, ...]) -> str:
        if value not in choices:
            raise self._fail(f"{what} must be one of {', '.join(map(repr, choices))}, got {value!r}")
        return value

    def _validate_regex(self) -> None:
        if not isinstance(self.pattern, str) or not self.pattern:
            raise self._fail("needs a pattern")
        if not isinstance(self.case_sensitive, bool):
            raise self._fail(f"case_sensitive must be true or false, got {self.case_sensitive!r}")
        try:
            self._compiled = re.compile(self.pattern, 0 if self.case_sensitive else re.IGNORECASE)
        except re.error as e:
            raise self._fail(f"pattern {self.pattern!r} is not a valid regular expression: {e}") from e

    def _validate_json(self) -> None:
        if self.keys is not None:
            self.keys = self._strings(self.keys, "keys")

    def _validate_length(self) -> None:
        if self.min_chars is None and self.max_chars is None:
            raise self._fail("needs min_chars or max_chars")
        if self.min_chars is not None:
            self.min_chars = self._number(self.min_chars, "min_chars", minimum=0, integer=True)
        if self.max_chars is not None:
            self.max_chars = self._number(self.max_chars, "max_chars", minimum=1, integer=True)
        if None not in (self.min_chars, self.max_chars) and self.min_chars > self.max_chars:
            raise self._fail(f"min_chars ({self.min_chars}) is above max_chars ({self.max_chars})")

    def _validate_keyword(self) -> None:
        self.words = self._strings(self.words, "words")
        self.mode = self._choice(self.mode, "mode", ("any", "all"))

    def _validate_command(self) -> None:
        if isinstance(self.command, str):  # a string would need a shell to split it, and shells are never used
            raise self._fail(
                f"command must be a list of arguments (it is never run through a shell), e.g. {self.command.split()!r}"
            )
        if (
            not isinstance(self.command, (list, tuple))
            or not self.command
            or not all(isinstance(a, str) for a in self.command)
        ):
            raise self._fail(f"needs command, a non-empty list of strings, got {self.command!r}")
        self.command = list(self.command)
        self.input = self._choice(self.input, "input", ("stdin", "file"))
        self.score_from = self._choice(self.score_from, "score_from", ("exit_code", "stdout"))
        if self.input == "file" and not any(COMPLETION_FILE in a for a in self.command):
            raise self._fail(
                f"input='file' needs a {COMPLETION_FILE!r} argument in command, "
                "otherwise the command never sees the completion"
            )
        self.min_score = self._number(self.min_score, "min_score")
        self.max_score = self._number(self.max_score, "max_score")
        if self.score_from == "stdout" and self.min_score == self.max_score:
            raise self._fail("min_score and max_score must differ to rescale stdout")
        self.timeout = self._number(self.timeout, "timeout", minimum=0)

    def _validate_custom(self) -> None:
        if not isinstance(self.file, (str, os.PathLike)) or not str(self.file):
            raise self._fail("needs file, the path of a Python file")
        path = Path(self.file).expanduser()
        if not path.is_file():
            raise self._fail(f"reward file {str(path)!r} does not exist")
        self.file = str(path.resolve())
        if not isinstance(self.fn, str) or not self.fn.isidentifier():
            raise self._fail(f"fn must be a Python function name, got {self.fn!r}")
        self.timeout = self._number(self.timeout, "timeout", minimum=0)

    # -- the serializable spec --

    @classmethod
    def from_dict(cls, spec: Mapping[str, Any], base_dir: str | Path | None = None) -> Reward:
        """A reward from a plain mapping (YAML, config.json); a relative `file` is resolved against base_dir."""
        if not isinstance(spec, Mapping) or "type" not in spec:
            raise RewardError(f"a reward spec must be a mapping with a type, got {spec!r}")
        kind = spec["type"]
        if kind not in OPTIONS:
            raise RewardError(f"unknown reward type {kind!r}; known: {', '.join(OPTIONS)}")
        allowed = {"type", "weight", "name", *OPTIONS[kind]}
        extra = sorted(map(str, set(spec) - allowed))
        if extra:
            label = spec.get("name", kind)
            raise RewardError(
                f"reward {label!r} ({kind}) does not take {', '.join(extra)}; "
                f"it takes {', '.join(sorted(allowed - {'type'}))}"
            )
        spec = dict(spec)
        if spec.get("file") is not None and base_dir is not None:
            spec["file"] = str(Path(base_dir) / spec["file"])
        return cls(**spec)

    def to_dict(self, relative_to: str | Path | None = None) -> dict[str, Any]:
        """The spec as plain data; a custom file under relative_to (a run directory) is written relative to it."""
        out = {"type": self.type, "weight": self.weight, "name": self.name}
        out.update({k: getattr(self, k) for k in OPTIONS[self.type]})
        if self.type == "custom" and relative_to is not None:
            try:
                out["file"] = Path(self.file).relative_to(Path(relative_to).resolve()).as_posix()
            except ValueError:
                pass  # outside the run directory: keep the absolute path
        return out

    def localize(self, run_dir: str | Path) -> Reward:
        """Copy a custom reward's file into run_dir/rewards/ so the run is self-contained; others are unchanged."""
        if self.type != "custom":
            return self
        source, target = Path(self.file), Path(run_dir) / "rewards" / Path(self.file).name
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.resolve() != source:
            if target.exists() and target.read_bytes() != source.read_bytes():
                raise self._fail(f"{target} already holds a different file; rename one of the reward files")
            shutil.copyfile(source, target)
        return replace(self, file=str(target))

    # -- scoring --

    def load(self) -> Callable:
        """The custom reward's function, loaded once; a clear error naming the file if it is not there."""
        if self._function is None:
            self._function = _load_function(Path(self.file), self.fn, self._fail)
        return self._function

    def score(self, completion: str, reference: Any = None, prompt: str = "", row: Mapping | None = None) -> float:
        """Score one completion. Raises on a broken row; RewardSet.score decides whether that stops the run."""
        if self.type in NEEDS_REFERENCE:
            if _blank(reference):
                raise self._fail("this row has no reference to compare with")
            return {"exact": exact, "contains": contains, "numeric": numeric}[self.type](completion, str(reference))
        return getattr(self, f"_score_{self.type}")(completion, reference, prompt, row or {})

    def _score_regex(self, completion: str, *_: Any) -> float:
        return float(self._compiled.search(completion) is not None)

    def _score_json(self, completion: str, *_: Any) -> float:
        try:
            value = json.loads(unfence(completion))
        except (ValueError, RecursionError):  # RecursionError: absurdly deep nesting
            return 0.0
        if not self.keys:
            return 1.0
        # Partial credit per required key gives the policy a gradient towards the full shape.
        return sum(k in value for k in self.keys) / len(self.keys) if isinstance(value, dict) else 0.0

    def _score_length(self, completion: str, *_: Any) -> float:
        # Linear fall-off: from 0 chars up to min_chars, and from max_chars to 0 at twice max_chars.
        n = len(completion)
        if self.min_chars and n < self.min_chars:
            return n / self.min_chars
        if self.max_chars is not None and n > self.max_chars:
            return max(0.0, 1.0 - (n - self.max_chars) / self.max_chars)
        return 1.0

    def _score_keyword(self, completion: str, *_: Any) -> float:
        # Whole words, case-insensitive: "cat" should not be found inside "category".
        found = [re.search(rf"(?<!\w){re.escape(w)}(?!\w)", completion, re.IGNORECASE) is not None for w in self.words]
        return float(any(found) if self.mode == "any" else all(found))

    def _score_command(self, completion: str, *_: Any) -> float:
        data = completion.encode("utf-8", errors="replace")
        with tempfile.TemporaryDirectory(prefix="dragon-reward-") as tmp:
            argv, stdin = self.command, data
            if self.input == "file":
                path = Path(tmp) / "completion.py"  # .py: the usual command is pytest or python on the file
                path.write_bytes(data)
                argv, stdin = [a.replace(COMPLETION_FILE, str(path)) for a in self.command], None
            try:
                code, stdout = run_command(argv, stdin, self.timeout)
            except OSError as e:
                raise self._fail(f"cannot run {argv[0]!r}: {e}") from e
        if code is None:  # timed out
            return 0.0
        if self.score_from == "exit_code":
            return float(code == 0)
        value = last_number(stdout)
        if value is None:
            return 0.0
        scaled = (float(value) - self.min_score) / (self.max_score - self.min_score)
        return min(1.0, max(0.0, scaled))

    def _score_custom(self, completion: str, reference: Any, prompt: str, row: Mapping) -> float:
        value = call_with_timeout(
            self.load(),
            (prompt, completion, reference, row),
            self.timeout,
            lambda: self._fail(f"{self.fn}() in {self.file} took longer than {self.timeout:g} s"),
        )
        if not (isinstance(value, (int, float)) and math.isfinite(value)):  # NaN would poison the weighted sum
            raise self._fail(f"{self.fn}() in {self.file} returned {value!r}, not a finite number")
        return float(value)


@dataclass
class RewardScores:
    """Per-reward scores for each row, their weighted total, and how many rows each reward failed on."""

    scores: dict[str, list[float]]
    total: list[float]
    errors: dict[str, int]

    def means(self) -> dict[str, float]:
        """Progress and evaluation columns: `reward` (weighted total) and `reward_<name>` per reward."""
        out = {"reward": mean(self.total) if self.total else float("nan")}
        out.update({f"reward_{n}": mean(v) if v else float("nan") for n, v in self.scores.items()})
        return out


class RewardSet:
    """Rewards summed by weight, with unique names."""

    def __init__(self, rewards: Iterable[Reward | Mapping] | Reward | Mapping, base_dir: str | Path | None = None):
        if isinstance(rewards, (Reward, Mapping)):
            rewards = [rewards]
        self.rewards = [r if isinstance(r, Reward) else Reward.from_dict(r, base_dir) for r in rewards]
        if not self.rewards:
            raise RewardError("a reward set needs at least one reward")
        seen: set[str] = set()
        for r in self.rewards:
            if r.name in seen:
                raise RewardError(f"reward name {r.name!r} is used twice; give one of them another name")
            seen.add(r.name)

    @classmethod
    def from_list(cls, specs: Iterable[Mapping] | Mapping, base_dir: str | Path | None = None) -> RewardSet:
        return cls(specs, base_dir=base_dir)

    def to_list(self, relative_to: str | Path | None = None) -> list[dict[str, Any]]:
        return [r.to_dict(relative_to) for r in self.rewards]

    def __iter__(self):
        return iter(self.rewards)

    def __len__(self) -> int:
        return len(self.rewards)

    @property
    def names(self) -> list[str]:
        return [r.name for r in self.rewards]

    def weights(self) -> list[float]:
        """In reward order, for GRPOConfig.reward_weights."""
        return [r.weight for r in self.rewards]

    def localize(self, run_dir: str | Path) -> RewardSet:
        """A copy whose custom files live in run_dir/rewards/; save it with to_list(relative_to=run_dir)."""
        return RewardSet([r.localize(run_dir) for r in self.rewards])

    def check_rows(self, rows: Sequence[Mapping], load_custom: bool = True) -> None:
        """Fail before training if a reward cannot work on this dataset (no reference, broken custom file).

        load_custom=False checks everything but the custom files' code: the Dagster step process checks that
        way, and only the worker imports and runs a custom file (it runs with the user's rights)."""
        for r in self.rewards:
            if r.type == "custom" and load_custom:
                r.load()
            if r.type not in NEEDS_REFERENCE:
                continue
            missing = [i for i, row in enumerate(rows) if _blank(row.get("reference"))]
            if missing and len(missing) == len(rows):
                raise r._fail(
                    "compares against a reference, but the dataset lacks a reference; "
                    "map a reference column or use a reward that needs none"
                )
            if missing:
                raise r._fail(
                    f"compares against a reference, but {len(missing)} of {len(rows)} rows lack one "
                    f"(rows {_some(missing)})"
                )
            if r.type == "numeric":
                # Without a number in the reference every completion scores 0: no signal, only wasted compute.
                bad = [i for i, row in enumerate(rows) if last_number(str(row["reference"])) is None]
                if bad:
                    raise r._fail(f"needs a number in each reference; {len(bad)} rows have none (rows {_some(bad)})")

    def score(self, completions: Sequence[Any], rows: Sequence[Mapping], on_error: str = "raise") -> RewardScores:
        """Score completions[i] against rows[i]. on_error="zero" scores a failing row 0 and counts it."""
        if len(completions) != len(rows):
            raise RewardError(f"{len(completions)} completions for {len(rows)} rows")
        scores, errors = {}, {}
        for r in self.rewards:
            scores[r.name], errors[r.name] = score_rows(r, completions, rows, on_error)
        total = [sum(r.weight * scores[r.name][i] for r in self.rewards) for i in range(len(rows))]
        return RewardScores(scores, total, errors)


def score_rows(
    reward: Reward, completions: Sequence[Any], rows: Sequence[Mapping], on_error: str = "raise"
) -> tuple[list[float], int]:
    """One reward over aligned completions and rows: the scores and the number of rows that failed."""
    if on_error not in ("raise", "zero"):
        raise RewardError(f"on_error must be 'raise' or 'zero', got {on_error!r}")
    out, failed = [], 0
    for i, (completion, row) in enumerate(zip(completions, rows)):
        try:
            out.append(
                reward.score(
                    _text(completion, "assistant"), row.get("reference"), _text(row.get("prompt", ""), "user"), row
                )
            )
        except Exception as e:
            if on_error == "raise":
                where = f" in {reward.file}" if reward.type == "custom" else ""
                raise RewardError(f"reward {reward.name!r}{where} failed on row {i}: {type(e).__name__}: {e}") from e
            out.append(0.0)
            failed += 1
    return out, failed


def trl_reward_funcs(rewards: RewardSet | Iterable[Reward | Mapping], on_error: str = "raise") -> list[Callable]:
    """One TRL reward function per reward, named after it; give TRL the weights via GRPOConfig.reward_weights.

    Each has TRL's signature f(prompts, completions, completion_ids=None, **columns) -> list[float] and an
    `errors` attribute counting the rows it scored 0 because the reward failed (with on_error="zero").
    """
    reward_set = rewards if isinstance(rewards, RewardSet) else RewardSet(rewards)
    return [_trl_func(r, on_error) for r in reward_set]


def _trl_func(reward: Reward, on_error: str) -> Callable:
    def func(prompts, completions, completion_ids=None, **kwargs) -> list[float]:
        rows = _trl_rows(prompts, kwargs)
        scores, failed = score_rows(reward, completions, rows, on_error)
        func.errors += failed
        return scores

    func.__name__ = func.__qualname__ = reward.name  # TRL logs rewards/<__name__>/mean
    func.errors = 0
    func.reward = reward
    return func


def _trl_rows(prompts: Sequence[Any], kwargs: Mapping[str, Any]) -> list[dict]:
    """TRL passes each dataset column as a keyword list aligned with the completions; rebuild the rows."""
    n = len(prompts)
    columns = {k: v for k, v in kwargs.items() if k not in _TRL_EXTRAS and isinstance(v, (list, tuple)) and len(v) == n}
    return [{"prompt": p, **{k: v[i] for k, v in columns.items()}} for i, p in enumerate(prompts)]


def call_with_timeout(function: Callable, args: tuple, timeout: float, fail: Callable[[], Exception]) -> Any:
    """function(*args), interrupted after timeout seconds (SIGALRM: the main thread of a POSIX process, where TRL
    calls rewards); elsewhere it runs without a limit. 0 means no limit."""
    if not timeout or not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        return function(*args)

    def expire(signum, frame):
        raise fail()

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        return function(*args)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_command(argv: Sequence[str], stdin: bytes | None, timeout: float) -> tuple[int | None, str]:
    """Run argv directly (no shell); its exit code, or None after a timeout, and the tail of its stdout.

    stdin is piped in by one thread while another keeps only the last bytes of stdout, so neither a command
    that ignores its input nor one that prints gigabytes can block or exhaust memory. The command gets its own
    process group, so a timeout also ends whatever it started.
    """
    posix = os.name == "posix"
    proc = subprocess.Popen(
        list(argv),
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=posix,
    )
    tail = bytearray()
    threads = [threading.Thread(target=_drain, args=(proc.stdout, tail), daemon=True)]
    if stdin is not None:
        threads.append(threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True))
    for t in threads:
        t.start()
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        code = None
    _kill_group(proc, posix)  # also after a normal exit: leftovers would hold stdout open and keep running
    for t in threads:
        t.join(timeout=5)
    proc.stdout.close()
    return code, bytes(tail).decode("utf-8", errors="replace")


def _drain(stream, tail: bytearray) -> None:
    for chunk in iter(lambda: os.read(stream.fileno(), 65536), b""):
        tail.extend(chunk)
        del tail[:-_STDOUT_TAIL]


def _feed(stream, data: bytes) -> None:
    try:
        stream.write(data)
        stream.close()
    except OSError:  # the command exited or closed stdin without reading it all; that is its choice
        pass


def _kill_group(proc: subprocess.Popen, posix: bool) -> None:
    try:
        if posix:
            os.killpg(proc.pid, signal.SIGKILL)
        elif proc.poll() is None:
            proc.kill()
    except OSError:
        pass  # already gone
    proc.wait()


def _load_function(path: Path, fn: str, fail: Callable[[str], RewardError]) -> Callable:
    # SourceFileLoader accepts any file name; registering the module lets dataclasses and pickling inside it work.
    module_name = f"dragon_reward_{abs(hash(str(path)))}"
    spec = spec_from_loader(module_name, SourceFileLoader(module_name, str(path)))
    module = module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        raise fail(f"loading {path} failed: {type(e).__name__}: {e}") from e
    function = getattr(module, fn, None)
    if not callable(function):
        raise fail(f"{path} does not define a function {fn}(prompt, completion, reference, row)")
    return function


def _text(value: Any, role: str) -> str:
    """Plain text from a string or chat messages: the last message of `role`, else the last message."""
    if value is None:
        return ""
    if isinstance(value, Mapping):
        value = [value]
    if isinstance(value, (list, tuple)):
        if not value:
            return ""
        message = next((m for m in reversed(value) if isinstance(m, Mapping) and m.get("role") == role), value[-1])
        content = message.get("content", "") if isinstance(message, Mapping) else message
        if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}, ...]
            return "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
        return "" if content is None else str(content)
    return str(value)


def _blank(value: Any) -> bool:
    # pandas turns an empty cell into NaN, which must count as missing rather than the text "nan".
    return value is None or (isinstance(value, float) and math.isnan(value)) or not str(value).strip()


def _some(indices: list[int], limit: int = 5) -> str:
    shown = ", ".join(map(str, indices[:limit]))
    return shown + (", ..." if len(indices) > limit else "")
