"""Pipes messages on a shared stdout as whole lines: one write call per message, its newline included.

A Ray job's driver and a pod share stdout with other writers (Ray prints its worker actors' output into the
driver's stdout from a thread of its own). dagster-pipes' stream channel writes a message and its newline as
two writes, so under PYTHONUNBUFFERED another thread's text can land between them and glue itself to the
message's line, where the log reader no longer finds a message: that is how a step's last metrics went missing.
One write of the whole line cannot be split that way; the Ray reader (resources/launchers/ray_logs.py) also finds
a message that another writer's text is glued in front of or behind.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from dagster_pipes import PipesDefaultMessageWriter, PipesMessageWriterChannel, PipesParams

_WRITE_LOCK = threading.Lock()  # the driver's relay thread and its main thread both report


class WholeLineChannel(PipesMessageWriterChannel):
    """Writes each message as one line in one write call, flushed."""

    def __init__(self, stream):
        self.stream = stream

    def write_message(self, message) -> None:
        line = json.dumps(message) + "\n"
        with _WRITE_LOCK:
            self.stream.write(line)
            self.stream.flush()


class WholeLineMessageWriter(PipesDefaultMessageWriter):
    """Dagster's default writer, with whole-line writes where it would write to stdout or stderr."""

    @contextmanager
    def open(self, params: PipesParams) -> Iterator[PipesMessageWriterChannel]:
        stream = params.get(self.STDIO_KEY)
        if self.FILE_PATH_KEY not in params and stream in (self.STDOUT, self.STDERR):
            yield WholeLineChannel(sys.stdout if stream == self.STDOUT else sys.stderr)
        else:
            with super().open(params) as channel:
                yield channel
