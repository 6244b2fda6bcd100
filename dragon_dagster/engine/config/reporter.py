"""How a trainer reports: log lines, step metrics, and whether it has been asked to stop.

The base class prints; the worker's subclass streams to Dagster Pipes and MLflow. Trainers only see this
interface, so they run the same in a notebook, a test, or a child process of a Dagster run.
"""

from __future__ import annotations


class Reporter:
    def __init__(self):
        self.stop_requested = False

    def log(self, message: str) -> None:
        print(message, flush=True)

    def metrics(self, step: int, values: dict[str, float]) -> None:
        pass

    def should_stop(self) -> bool:
        return self.stop_requested
