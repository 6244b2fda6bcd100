"""The Dagster log a terminal shows (`dragon demo`, a materialization from Python): a line per stage and a progress
bar, not the run's every record.

By default the terminal gets, per stage, a line when it ends (its time, whether it was made or reused, its headline
figures) and, on a terminal, a progress bar while it runs (training steps done of all, from the StepProgress the
training resource puts on each step's record); elsewhere (a pipe, a file, CI) a plain line when it starts instead
of the bar. Records at or above `log_level` (WARNING by default) print as Dagster's colored console logger prints
them; `log_level: INFO` (`dragon demo --verbose`) brings back the run's own lines, each training step's with its
figures among them. The run's event log and MLflow get everything whatever this shows.

A failed blocking check's step failure is said in one line instead of Dagster's stack trace. A failed check is the
pipeline working as meant (bad data stopped before training), not a bug to debug: its reason is the check's own
description, which `dragon demo` prints with the checks after the run. Any other failure keeps its stack trace.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass, field

from dagster import DagsterEventType, Field, logger
from dagster._core.log_manager import LOG_RECORD_METADATA_ATTR
from dagster._utils.log import create_console_logger

from ..engine.config.reporter import STEP_RECORD_ATTR, StepProgress

TRACE = "\n\nStack Trace:"
CHECK_FAILED = "DagsterAssetCheckFailedError: "  # after its module's name: dagster._core.errors.
# A stage's headline figures on its line, from its materialization's metadata, in this order (at most HEADLINE_MAX),
# each in its words: a dataset's rows, a training stage's loss and own held-out figures, a merge's size, the report's
# losses and verdict.
HEADLINE = {
    "rows": "{} rows",
    "train_rows": "{} train rows",
    "eval_rows": "{} held-out",
    "train_loss": "train loss {}",
    "eval_loss": "held-out loss {}",
    "perplexity": "perplexity {}",
    "pref_accuracy": "preference accuracy {}",
    "reward_margin": "reward margin {}",
    "reward_before": "reward {}",
    "reward_after": "-> {}",
    "kl": "KL {}",
    "parameters": "{} parameters",
    "size_mb": "{} MB",
    "base_eval_loss": "held-out loss base {}",
    "merged_eval_loss": "-> merged {}",
    "merged_not_worse": "merged not worse: {}",
}
HEADLINE_MAX = 4


class BlockingCheckInOneLine(logging.Filter):
    """A record of a step or run that failed because a blocking check failed, without the stack trace."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if CHECK_FAILED in text and TRACE in text:
            before, _, why = text.partition(TRACE)[0].partition(CHECK_FAILED)
            what = before.rsplit("\n\n", 1)[0]  # "Execution of step ... failed." without the error's class
            record.msg = f"{' '.join(what.split())} {' '.join(why.split())} (the check's reason is printed below)"
            record.args = ()
        return True


def figure(value) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def headline(metadata: dict) -> str:
    """The stage's headline figures from its materialization's metadata (raw values by key), in a few words."""
    shown = [words.format(figure(metadata[key])) for key, words in HEADLINE.items() if key in metadata]
    text = ""
    for part in shown[:HEADLINE_MAX]:  # "reward 0.1 -> 0.3": an after follows its before
        text += (" " if part.startswith("->") else ", ") + part if text else part
    return text


@dataclass
class Stage:
    """What the view knows of a running stage (a Dagster step)."""

    name: str
    started: float = field(default_factory=time.monotonic)
    metadata: dict = field(default_factory=dict)
    reused_from: str | None = None
    task: int | None = None  # its progress bar's, on a terminal


def stage_names(job_def) -> dict[str, str] | None:
    """The job's steps that materialize an asset, by step key, each named by its asset as the demo's table names
    it (support/sft_adapter); a blocking check's own step is none of them. None without the job: every step is."""
    if job_def is None:
        return None
    from dagster._core.definitions.dependency import NodeHandle

    names = {}
    for node in job_def.graph.nodes:
        assets = job_def.asset_layer.get_assets_def_for_node(NodeHandle(node.name, None))
        if assets is not None and assets.keys:
            names[node.name] = ", ".join(sorted(key.to_user_string() for key in assets.keys))
    return names


def terminal():
    """stderr as it is now, when the run starts: Dagster's compute-log capture points fd 2 at a file while a step
    runs (a `tail` copies it to the terminal), where a bar would go into the step's captured output in the UI and
    would not be drawn (not a terminal). A copy of the descriptor keeps writing where stderr pointed."""
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # a stream without one (a test's StringIO)
        return sys.stderr
    return os.fdopen(os.dup(fd), "w", buffering=1, encoding=getattr(sys.stderr, "encoding", None) or "utf-8")


class StageView(logging.Handler):
    """A line per stage and a progress bar while one runs, from the run's events and step records."""

    def __init__(self, names: dict[str, str] | None = None, stream=None):
        super().__init__(logging.DEBUG)
        self.names = names
        from rich.console import Console

        self.stream = stream or terminal()
        self.tty = self.stream.isatty()
        self.console = Console(file=self.stream, highlight=False, soft_wrap=True, force_terminal=self.tty)
        self.stages: dict[str, Stage] = {}
        self.progress = None

    def emit(self, record: logging.LogRecord) -> None:
        meta = getattr(record, LOG_RECORD_METADATA_ATTR, None) or {}
        step_key = meta.get("step_key")
        progress: StepProgress | None = getattr(record, STEP_RECORD_ATTR, None)
        event = meta.get("dagster_event")
        # one record at a time (logging.Handler.handle holds the handler's lock), from the step's thread or a
        # Pipes reader's
        if progress is not None and step_key in self.stages:
            self.advance(self.stages[step_key], progress)
        elif event is not None and event.step_key:
            self.on_event(event)

    def on_event(self, event) -> None:
        kind, key = event.event_type, event.step_key
        if kind == DagsterEventType.STEP_START:
            if self.names is None or key in self.names:
                stage = self.stages[key] = Stage(self.names[key] if self.names else key)
                self.start(stage)
        elif key not in self.stages:  # a check's own step says something only when it fails
            if kind == DagsterEventType.STEP_FAILURE:
                self.say(f"✗ {key}  failed")
        elif kind == DagsterEventType.ASSET_MATERIALIZATION:
            stage = self.stages[key]
            metadata = {
                k: getattr(v, "value", v) for k, v in event.event_specific_data.materialization.metadata.items()
            }
            stage.metadata.update(metadata)
            if metadata.get("reused"):
                stage.reused_from = str(metadata.get("reused_from_run") or "")
        elif kind in (DagsterEventType.STEP_SUCCESS, DagsterEventType.STEP_FAILURE):
            self.end(self.stages.pop(key), ok=kind == DagsterEventType.STEP_SUCCESS)

    def start(self, stage: Stage) -> None:
        if not self.tty:
            self.say(f"… {stage.name}")
            return
        if self.progress is None:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("steps"),
                TimeElapsedColumn(),
                console=self.console,
                transient=True,
            )
            self.progress.start()
        stage.task = self.progress.add_task(stage.name, total=None)

    def advance(self, stage: Stage, progress: StepProgress) -> None:
        if self.progress is not None and stage.task is not None:
            self.progress.update(stage.task, completed=progress.done, total=progress.total, refresh=True)

    def end(self, stage: Stage, ok: bool) -> None:
        if self.progress is not None and stage.task is not None:
            self.progress.remove_task(stage.task)
            if not self.progress.tasks:  # nothing runs: the terminal is the lines' again
                self.progress.stop()
                self.progress = None
        seconds = time.monotonic() - stage.started
        if not ok:
            self.say(f"✗ {stage.name}  failed after {seconds:.1f} s")
            return
        made = f"reused (run {stage.reused_from[:8]})" if stage.reused_from is not None else "new"
        figures = headline(stage.metadata)
        self.say(f"✓ {stage.name}  {seconds:.1f} s  {made}" + (f"  {figures}" if figures else ""))

    def say(self, line: str) -> None:
        self.console.print(line, markup=False)

    def close(self) -> None:
        with self.lock:
            if self.progress is not None:
                self.progress.stop()
                self.progress = None
        super().close()


@logger(
    {
        "log_level": Field(
            str,
            is_required=False,
            default_value="WARNING",
            description="Records at or above it print as lines besides the stages' (INFO: each training step's).",
        ),
        "name": Field(str, is_required=False, default_value="dagster", description="The logger's name."),
    },
    description="A line per stage and a progress bar; the run's records at or above log_level as Dagster prints them.",
)
def console_logger(init_context) -> logging.Logger:
    """Dagster's colored console logger at log_level, with BlockingCheckInOneLine, and the StageView."""
    config = init_context.logger_config
    log = create_console_logger(name=config["name"], level=config["log_level"])
    log.setLevel(logging.DEBUG)  # the stage view reads the run's events, which Dagster logs at DEBUG
    log.addFilter(BlockingCheckInOneLine())
    log.addHandler(StageView(stage_names(init_context.job_def)))
    return log
