"""The custom reward (accuracy family): a Python file defining `reward(prompt, completion, reference, row)`,
imported and run only where rewards are scored (the worker), with the user's rights and a time limit per call.
Also call_with_timeout, which runs a function with that limit."""

from __future__ import annotations

import math
import os
import shutil
import signal
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, PrivateAttr, ValidationInfo, field_validator

from ..source_files import run_file
from .base import FILES_FROM, Number, Reward, RewardError


class CustomReward(Reward):
    """Calls fn(prompt, completion, reference, row) from a Python file; it returns a finite number."""

    family: ClassVar[Literal["accuracy", "format"]] = "accuracy"
    type: Literal["custom"] = "custom"
    file: str = Field(
        min_length=1,
        description="The Python file defining the function; a relative path is read from the spec's folder.",
    )
    fn: str = Field("reward", description="The function's name in the file.")
    timeout: Number = Field(30.0, ge=0, description="Seconds one call may take; 0: no limit.")
    _function: Callable | None = PrivateAttr(None)

    @field_validator("file", mode="before")
    @classmethod
    def _found(cls, file: Any, info: ValidationInfo) -> Any:
        if isinstance(file, os.PathLike):
            file = os.fspath(file)
        context = info.context or {}
        if FILES_FROM not in context or not isinstance(file, str) or not file:
            return file  # inside a bigger model no folder is known: kept as written, resolved when the set is built
        base_dir = context[FILES_FROM]  # parse_reward: resolved against the spec's folder, and it must be there
        path = (Path(base_dir) / file if base_dir is not None else Path(file)).expanduser()
        if not path.is_file():
            raise ValueError(f"{str(path)!r} does not exist")
        return str(path.resolve())

    @field_validator("fn")
    @classmethod
    def _a_function_name(cls, fn: str) -> str:
        if not fn.isidentifier():
            raise ValueError(f"must be a Python function name, got {fn!r}")
        return fn

    def to_dict(self, relative_to: str | Path | None = None) -> dict[str, Any]:
        """As Reward.to_dict; a file under relative_to (a run directory) is written relative to it."""
        out = super().to_dict(relative_to)
        if relative_to is not None:
            try:
                out["file"] = Path(self.file).relative_to(Path(relative_to).resolve()).as_posix()
            except ValueError:
                pass  # outside the run directory: keep the absolute path
        return out

    def localize(self, run_dir: str | Path) -> CustomReward:
        """A copy whose file lives in run_dir/rewards/, named relative to run_dir (resolved(run_dir) finds it
        wherever the run directory is then), so the run is self-contained. Its file must be resolved already."""
        source, target = Path(self.file), Path(run_dir) / "rewards" / Path(self.file).name
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.resolve() != source:
            if target.exists() and target.read_bytes() != source.read_bytes():
                raise self._fail(f"{target} already holds a different file; rename one of the reward files")
            shutil.copyfile(source, target)
        return self.model_copy(update={"file": target.relative_to(run_dir).as_posix()})

    def resolved(self, base_dir: str | Path | None = None) -> CustomReward:
        path = Path(self.file).expanduser()
        if not path.is_absolute():
            path = Path(base_dir if base_dir is not None else ".") / path
        if not path.is_file():
            raise self._fail(f"reward file {str(path)!r} does not exist")
        return self.model_copy(update={"file": str(path.resolve())})

    def load(self) -> Callable:
        """The function, loaded once; a clear error naming the file if it is not there."""
        if self._function is None:
            self._function = _load_function(Path(self.file), self.fn, self._fail)
        return self._function

    def score(self, completion: str, reference: Any = None, prompt: str = "", row: Mapping | None = None) -> float:
        value = call_with_timeout(
            self.load(),
            (prompt, completion, reference, row or {}),
            self.timeout,
            lambda: self._fail(f"{self.fn}() in {self.file} took longer than {self.timeout:g} s"),
        )
        if not (isinstance(value, (int, float)) and math.isfinite(value)):  # NaN would poison the weighted sum
            raise self._fail(f"{self.fn}() in {self.file} returned {value!r}, not a finite number")
        return float(value)


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


def _load_function(path: Path, fn: str, fail: Callable[[str], RewardError]) -> Callable:
    try:
        module = run_file(path, "dragon_reward")
    except Exception as e:
        raise fail(f"loading {path} failed: {type(e).__name__}: {e}") from e
    function = getattr(module, fn, None)
    if not callable(function):
        raise fail(f"{path} does not define a function {fn}(prompt, completion, reference, row)")
    return function
