"""The Ray job log as a Pipes channel: messages survive lines caught half written and other writers' text."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from dagster_pipes import PIPES_PROTOCOL_VERSION, PIPES_PROTOCOL_VERSION_FIELD

from dragon_dagster.resources.launchers.ray_logs import split_line, whole_lines


def message(step: int) -> dict:
    return {
        PIPES_PROTOCOL_VERSION_FIELD: PIPES_PROTOCOL_VERSION,
        "method": "report_custom_message",
        "params": {"payload": {"kind": "metrics", "step": step, "values": {"train/loss": 1.5}}},
    }


def test_a_message_cut_between_two_chunks_is_put_back_together():
    line = json.dumps(message(8))
    chunks = ["starting\n" + line[:40], None, line[40:] + "\n", "done"]  # Ray's tail caught the line half written
    lines = [line for line in whole_lines(chunks) if line is not None]
    assert lines == ["starting", line, "done"]
    assert split_line(lines[1]) == ([message(8)], "")


def test_a_message_glued_to_other_text_is_found_and_the_text_kept():
    glued = "(RayTrainWorker pid=7) loading" + json.dumps(message(1)) + json.dumps(message(2)) + "weights"
    messages, text = split_line(glued)
    assert [m["params"]["payload"]["step"] for m in messages] == [1, 2]
    assert text == "(RayTrainWorker pid=7) loadingweights"


def test_text_that_only_looks_like_a_message_stays_text():
    line = 'see {"' + PIPES_PROTOCOL_VERSION_FIELD + '": oops'
    assert split_line(line) == ([], line)
    assert split_line("plain") == ([], "plain")


WRITER = textwrap.dedent(
    """
    import sys, threading
    from dragon_dagster.engine.runtime.pipes_lines import WholeLineMessageWriter

    def chatter():  # what Ray's log thread does in a driver: print other processes' lines into its stdout
        for i in range(4000):
            print(f"(RayTrainWorker pid={i}) a line of a worker", flush=True)

    with WholeLineMessageWriter().open({"stdio": "stdout"}) as channel:
        thread = threading.Thread(target=chatter)
        thread.start()
        for step in range(400):
            channel.write_message({"__dagster_pipes_version": "0.1", "method": "m", "params": {"step": step}})
        thread.join()
    """
)


def test_every_message_a_worker_writes_beside_another_thread_is_read_back():
    out = subprocess.run(
        [sys.executable, "-c", WRITER],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        timeout=120,
    ).stdout
    chunks = [out[i : i + 977] for i in range(0, len(out), 977)]  # arbitrary cuts, as Ray's tail makes them
    steps = [m["params"]["step"] for line in whole_lines(chunks) if line for m in split_line(line)[0]]
    assert steps == list(range(400))
