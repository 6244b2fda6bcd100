"""Reading a Ray job's log as its Pipes channel without losing messages.

dagster-ray's PipesRayJobMessageReader splits each chunk Ray's log tail sends on newlines and parses each piece
as a message. Ray's tail reads the driver's log file line by line and sends a line it caught half written as
it is (the rest comes in the next chunk), and the driver's stdout carries other writers' text (Ray prints the
worker actors' output there), which can glue itself to a message's line. Either way a message was lost, in CI a
step's last metrics. This reader keeps the unfinished end of a chunk until its newline arrives and finds a
message anywhere in a line, forwarding the text around it as the log it is. The worker writes each message as
one whole line (engine/runtime/pipes_lines.py), so a message is never cut by another writer's text.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterable, Iterator

from dagster_pipes import PIPES_PROTOCOL_VERSION_FIELD
from dagster_ray import PipesRayJobMessageReader

MARKER = '{"' + PIPES_PROTOCOL_VERSION_FIELD + '"'
FLUSH_AFTER_CLOSE_S = 30  # dagster-ray's own wait for the last lines once the session has closed


def whole_lines(chunks: Iterable[str | None]) -> Iterator[str | None]:
    """The complete lines of a stream of chunks (None, Ray's "nothing new yet", passes through so a caller can
    check on other things); an unfinished last line is held until its newline comes, or the stream ends."""
    pending = ""
    for chunk in chunks:
        if chunk is None:
            yield None
            continue
        pending += chunk
        *lines, pending = pending.split("\n")
        yield from lines
    if pending:
        yield pending


def split_line(line: str) -> tuple[list[dict], str]:
    """(the Pipes messages in line, the rest of its text): a message may have other text in front or behind."""
    messages, rest, start = [], [], 0
    decoder = json.JSONDecoder()
    while (at := line.find(MARKER, start)) >= 0:
        try:
            message, end = decoder.raw_decode(line, at)
        except json.JSONDecodeError:  # a marker in plain text, or a message cut short: text, as before
            rest.append(line[start : at + len(MARKER)])
            start = at + len(MARKER)
            continue
        rest.append(line[start:at])
        messages.append(message)
        start = end
    rest.append(line[start:])
    return messages, "".join(rest)


class WholeLineRayJobMessageReader(PipesRayJobMessageReader):
    """PipesRayJobMessageReader with lines put back together and messages found inside glued lines."""

    def handle_job_logs(self, handler) -> None:
        from dagster_ray.core.pipes import tail_logs

        try:
            while (self._job_id is None or self._client is None) and not self.session_closed.is_set():
                time.sleep(0.1)
            self.thread_ready.set()
            if self.session_closed.is_set():
                handler._context.log.warning("[pipes] PipesSession.report_launched was not called before it closed.")
                return
            closed_at = None
            for line in whole_lines(tail_logs(self.client.tail_job_logs(job_id=self.job_id))):
                if line:
                    messages, text = split_line(line)
                    for message in messages:
                        handler.handle_message(message)
                    if text.strip():
                        print(text, file=sys.stdout)
                if self.session_closed.is_set():
                    closed_at = closed_at or time.time()
                    if time.time() - closed_at > FLUSH_AFTER_CLOSE_S:
                        return
        finally:
            self.completed.set()
