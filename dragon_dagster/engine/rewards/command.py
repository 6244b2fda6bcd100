"""The command reward (accuracy family): run an argv on the completion, never through a shell, and score its
exit code or the last number it prints (through engine/commands.py's run_command)."""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from ..commands import run_command
from ..text.matchers import last_number
from .base import Number, Reward

COMPLETION_FILE = "{completion_file}"


class CommandReward(Reward):
    """Runs `command` with the completion on stdin (or in a file); scores exit code 0 as 1, or rescales the last
    number on stdout from [min_score, max_score] to [0, 1]. A timeout scores 0."""

    family: ClassVar[Literal["accuracy", "format"]] = "accuracy"
    type: Literal["command"] = "command"
    command: list[str] = Field(
        min_length=1, description="The argv, run directly (never through a shell); e.g. [pytest, -q, ...]."
    )
    input: Literal["stdin", "file"] = Field(
        "stdin", description=f"How the command gets the completion: on stdin, or as a file named by {COMPLETION_FILE}."
    )
    score_from: Literal["exit_code", "stdout"] = Field(
        "exit_code", description="Score 1 for exit code 0, or rescale the last number the command prints."
    )
    min_score: Number = Field(0.0, description="The stdout number that scores 0.")
    max_score: Number = Field(1.0, description="The stdout number that scores 1.")
    timeout: Number = Field(30.0, ge=0, description="Seconds before the command is ended.")

    @field_validator("command", mode="before")
    @classmethod
    def _an_argv(cls, command: Any) -> Any:
        if isinstance(command, str):  # a string would need a shell to split it, and shells are never used
            raise ValueError(f"must be a list of arguments (it is never run through a shell), e.g. {command.split()!r}")
        return command

    @model_validator(mode="after")
    def _consistent(self) -> CommandReward:
        if self.input == "file" and not any(COMPLETION_FILE in a for a in self.command):
            raise ValueError(
                f"input='file' needs a {COMPLETION_FILE!r} argument in command, "
                "otherwise the command never sees the completion"
            )
        if self.score_from == "stdout" and self.min_score == self.max_score:
            raise ValueError("min_score and max_score must differ to rescale stdout")
        return self

    def score(self, completion: str, reference: Any = None, prompt: str = "", row: Mapping | None = None) -> float:
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
