"""How a trainer reports: log lines, training steps, step metrics, and whether it has been asked to stop.

The base class prints; the worker's subclass streams to Dagster Pipes and MLflow. Trainers only see this
interface, so they run the same in a notebook, a test, or a child process of a Dagster run.
"""

from __future__ import annotations

from dataclasses import dataclass

# The attribute of a Dagster log record that carries a StepProgress (logging's `extra`): the terminal's stage view
# (assets/console_log.py) draws its progress bar from it, while the record's text is the step's line in the log.
STEP_RECORD_ATTR = "dragon_step"


@dataclass(frozen=True)
class StepProgress:
    """A training step done: how far the trainer is, and the step's line (its figures) for the log."""

    done: int
    total: int
    line: str


class Reporter:
    def __init__(self):
        self.stop_requested = False

    def log(self, message: str) -> None:
        print(message, flush=True)

    def step(self, progress: StepProgress) -> None:
        """A training step's line; a reporter that can tell it from other lines (the worker's) says how far it is."""
        self.log(progress.line)

    def metrics(self, step: int, values: dict[str, float]) -> None:
        pass

    def should_stop(self) -> bool:
        return self.stop_requested
