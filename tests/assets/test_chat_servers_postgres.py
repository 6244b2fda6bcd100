"""Several chat servers on one PostgreSQL feedback store (issue 31): two real `dragon chat-ui` processes take
ratings and edits from pages in a real Chromium at once, while the feedback sensor reads the store over and over
and a retraining runs on the record range it requested; then one chat process is killed -9 in the middle of a
burst of ratings. Every acknowledged record is stored once and whole, ids stay 1..max, the retraining read exactly
what the store had up to its watermark, and the sensor counts exactly what came after as new.

Each chat process has its own runs directory (DRAGON_RUNS_DIR): two chat servers stand for two machines, which
share the feedback database and nothing else (each traces its turns to an MLflow store of its own; two processes on
one SQLite MLflow store is not what is under test here). The retraining has a runs directory and a Dagster
instance of its own too, as the Dagster deployment would.

It prints the figures for the docs (pytest -s): writers, records, wall time, records/s, one write's latency, and
what the killed process left.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
from dagster import AssetSelection, DagsterInstance, materialize

from dragon_dagster.assets.automation import RANGE_TAG, feedback_records, last_used_id
from dragon_dagster.assets.factory import build_pipeline_defs
from dragon_dagster.engine.data.feedback.postgres import PostgresFeedbackStore
from dragon_dagster.engine.pipeline import load
from dragon_dagster.resources import ArtifactStore
from tests.assets.test_retraining import NAMES, tick
from tests.engine.data.feedback_support import ROOT
from tests.support import CHROMIUM_ARGS, completion, free_port, healthy, wait_until, write_pipeline

# a real PostgreSQL, two chat servers, six browser pages and a retraining (about 2 minutes of it) on 2 cores: 4-5 min
pytestmark = [pytest.mark.slow, pytest.mark.timeout(720)]

PAGES = 3  # browser pages per chat process: 6 concurrent writers across the two
QUESTIONS = 3  # each page asks this many questions, rates each reply, then edits its last reply
ACK_S = 90.0  # the longest a page waits for a rating's acknowledgement (2 shared cores, a retraining running)
KILL_AFTER = 6  # burst acknowledgements from the doomed process's pages before it is killed
AFTER_KILL = 3  # ratings each page of the surviving process gets acknowledged after the kill
SENT_S = 20.0  # how long an Enter may take to start its turn before it is pressed again (see ask)
RESENDS = 2
GONE_S = 8.0  # after the kill, how long a page of the killed process waits for an answer that cannot come
KILLED = threading.Event()  # set once the doomed process is killed (cleared when the test starts)
# "Recorded thumbs down on reply 1, replacing thumbs up (feedback #27, ...)": a changed verdict says what it replaces
ACK = re.compile(
    r"Recorded (thumbs up|thumbs down|edit) (?:on|of) reply (\d+)(?:, replacing thumbs \w+)? \(feedback #(\d+)"
)


def answer(text: str) -> str:
    return f"Answer to: {text}"


class ChatServer:
    """`dragon chat-ui --pipeline tiny --model <stub>` in a process of its own, on the shared feedback store."""

    def __init__(self, name: str, model_url: str, feedback_url: str, root: Path):
        self.name, self.model_url = name, model_url
        self.runs = root / name
        self.runs.mkdir(parents=True)
        self.log = self.runs / "chat-ui.log"
        self.killed_at: float | None = None
        self.env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),  # this checkout's package, whatever is installed
            "DRAGON_FEEDBACK_URL": feedback_url,
            "DRAGON_RUNS_DIR": str(self.runs),
        }
        self._start()

    def _start(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        command = [str(Path(sys.executable).with_name("dragon")), "chat-ui", "--pipeline", "tiny"]
        command += ["--model", self.model_url, "--port", str(self.port)]
        with self.log.open("w") as out:  # cwd: no project's pyproject, so the package's own definitions load
            self.proc = subprocess.Popen(
                command, cwd=self.runs, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def serving(self) -> bool:
        """This server answers on its port, and it is its own process that listens there: a port free_port chose
        can be taken by another test's server before this one binds it (then that one would answer here)."""
        try:
            listening = psutil.Process(self.proc.pid).net_connections(kind="tcp")
        except psutil.NoSuchProcess:
            return False
        ours = any(c.status == psutil.CONN_LISTEN and c.laddr.port == self.port for c in listening)
        return ours and healthy(self.url + "config")

    def exited(self) -> str | None:
        code = self.proc.poll()
        return None if code is None else f"exited with {code}:\n{self.log.read_text()[-3000:]}"

    def wait(self) -> None:
        for _ in range(3):  # a port taken by another test between free_port and the bind: start on another one
            try:
                wait_until(self.serving, 300, f"chat server {self.name}", alive=self.exited, every=0.5)
                return
            except pytest.fail.Exception:
                if "Cannot find empty port" not in self.log.read_text():
                    raise
                self._start()
        pytest.fail(f"chat server {self.name}: no free port in three tries")

    def kill(self) -> None:
        self.killed_at = time.monotonic()
        self.proc.send_signal(signal.SIGKILL)  # the process itself, mid-write: no handler, no cleanup
        self.proc.wait(30)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@dataclass
class Page:
    """One browser page on one chat server: its conversation as shown, and every rating it saw acknowledged."""

    name: str
    server: ChatServer
    page: object = None
    turns: list = field(default_factory=list)  # user, assistant, user, ... as the page shows them
    acks: dict = field(default_factory=dict)  # feedback id -> what the record must hold
    pending: dict | None = None  # the rating clicked and not acknowledged yet
    burst: int = 0  # ratings acknowledged in the burst
    after_kill: int = 0  # ratings clicked after the other process was killed, and acknowledged
    resent: int = 0  # questions whose Enter the page dropped and that were sent again (see ask)
    console: list = field(default_factory=list)  # the page's console errors and warnings, for a failure's message


def expected(page: Page, index: int, verdict: str, edited: str | None = None) -> dict:
    return {
        "verdict": verdict,
        "reply": page.turns[2 * index + 1]["content"],
        "edited": edited,
        "turns": [dict(m) for m in page.turns[: 2 * index + 1]],  # no system prompt: tiny is not in the package
    }


def whole(row: dict) -> dict:
    return {k: row[k] for k in ("verdict", "reply", "edited", "turns")}


async def status_text(page: Page) -> str:
    return await page.page.locator("#status").inner_text()


async def acknowledged(page: Page, what: str, before: str) -> int | None:
    """The feedback id in the status line once it acknowledges `what` (a new line: ids differ); None when no
    acknowledgement comes (its server was killed)."""
    deadline = time.monotonic() + ACK_S
    while time.monotonic() < deadline:
        text = await status_text(page)
        found = ACK.search(text)
        if text != before and found and re.match(f"Recorded {re.escape(what)}[ ,]", text):
            return int(found.group(3))
        assert text == before or "error" not in text.lower(), f"{page.name}: {text}"
        killed = page.server.killed_at
        if killed is not None and time.monotonic() - killed > GONE_S:
            return None
        await asyncio.sleep(0.1)
    raise AssertionError(f"{page.name}: no acknowledgement of {what} within {ACK_S:g} s (status: {text!r})")


async def rate(page: Page, index: int, verdict: str | None = None) -> int | None:
    """Click a thumb on reply `index` (None: the other thumb than the one lit, a new record each time) and wait for
    its acknowledgement."""
    panel = page.page.locator("#chatbot .message-buttons-left").nth(index)  # the reply's own buttons
    if verdict is None:
        verdict = "down" if await panel.get_by_label("Liked", exact=True).count() else "up"
    clicked_after_kill = KILLED.is_set()
    before = await status_text(page)
    page.pending = expected(page, index, verdict)
    await panel.get_by_label("Like" if verdict == "up" else "Dislike", exact=True).click()
    found = await acknowledged(page, f"thumbs {verdict} on reply {index + 1}", before)
    if found is not None:
        page.acks[found], page.pending = page.pending, None
        page.after_kill += clicked_after_kill
    return found


async def edit(page: Page, index: int, text: str) -> int:
    panel = page.page.locator("#chatbot .message-buttons-left").nth(index)
    before = await status_text(page)
    page.pending = expected(page, index, "edit", edited=text)
    await panel.get_by_label("Edit", exact=True).click()
    await page.page.locator("#chatbot textarea.edit-textarea").fill(text)
    await page.page.locator("#chatbot").get_by_label("Submit").click()
    found = await acknowledged(page, f"edit of reply {index + 1}", before)
    assert found is not None
    page.acks[found], page.pending = page.pending, None
    page.turns[2 * index + 1] = {"role": "assistant", "content": text}  # later ratings rate the edited reply
    return found


async def started(page: Page, text: str) -> bool:
    """Whether the turn asking `text` has begun (Stop shows, or the box no longer holds the text) within SENT_S."""
    deadline = time.monotonic() + SENT_S
    while time.monotonic() < deadline:
        if await page.page.locator("#stop").is_visible():
            return True
        if await page.page.locator("#message textarea").input_value() != text:
            return True
        await asyncio.sleep(0.2)
    return False


async def ask(page: Page, text: str) -> None:
    from playwright.async_api import expect

    box = page.page.locator("#message textarea")
    await box.fill(text)
    await box.press("Enter")
    # The turn has begun once Stop shows or the box is emptied. On 2 busy cores (a retraining in this process,
    # two chat servers, six pages) an Enter pressed just after a rating's acknowledgement was once dropped by
    # the page, with nothing sent; it is pressed again, as a person would, and counted (the figures print it).
    # A second Enter cannot send the question twice: the submit event allows none while one is pending.
    for _ in range(RESENDS):
        if await started(page, text):
            break
        page.resent += 1
        await box.press("Enter")
    try:
        await expect(page.page.locator("#chatbot").get_by_label(f"bot's message: {answer(text)}")).to_be_visible(
            timeout=ACK_S * 1000
        )
        await expect(page.page.locator("#status")).to_contain_text("Context", timeout=ACK_S * 1000)
    except AssertionError as exc:
        raise AssertionError(
            f"{page.name}: {text!r} Enter pressed {page.resent + 1} times; console: {page.console[-10:]}"
        ) from exc
    page.turns += [{"role": "user", "content": text}, {"role": "assistant", "content": answer(text)}]


async def converse(page: Page, k: int) -> None:
    """Questions, a rating on each reply as it comes, then an edit of the last reply. Each conversation starts
    with a like, so whatever range the sensor first requests has a liked reply of every conversation in it."""
    for i in range(QUESTIONS):
        await ask(page, f"{page.name} question {i + 1}")
        assert await rate(page, i, "up" if i == 0 or (i + k) % 2 == 0 else "down") is not None
    await edit(page, QUESTIONS - 1, f"A better answer from {page.name}.")


async def burst(page: Page, done) -> None:
    """Flip the thumbs on the page's replies, one rating after another, until done() (or its server is gone)."""
    i = 0
    while not done():
        if await rate(page, i % QUESTIONS) is None:
            return
        page.burst += 1
        i += 1


async def browse(chromium: Path, servers: list[ChatServer], figures: dict) -> list[Page]:
    from playwright.async_api import async_playwright

    doomed, survivor = servers
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS)
        pages = []
        for server in servers:
            for k in range(PAGES):
                context = await browser.new_context(viewport={"width": 1100, "height": 900})  # its own storage
                tab = await context.new_page()
                tab.set_default_timeout(ACK_S * 1000)
                page = Page(f"{server.name}-page{k + 1}", server, tab)
                tab.on("console", lambda m, page=page: m.type in ("error", "warning") and page.console.append(m.text))
                await tab.goto(server.url)
                pages.append(page)

        began = figures["writing_began"] = time.monotonic()
        await asyncio.gather(*(converse(page, k) for k, page in enumerate(pages)))
        figures["concurrent_s"] = time.monotonic() - began
        figures["concurrent_records"] = sum(len(page.acks) for page in pages)

        mine = [page for page in pages if page.server is doomed]
        theirs = [page for page in pages if page.server is survivor]

        async def killer():
            while sum(page.burst for page in mine) < KILL_AFTER:
                await asyncio.sleep(0.02)
            figures["in_flight_at_kill"] = sum(page.pending is not None for page in mine)
            KILLED.set()
            doomed.kill()

        began = time.monotonic()
        await asyncio.gather(
            killer(),
            *(burst(page, lambda: False) for page in mine),
            *(burst(page, lambda page=page: page.after_kill >= AFTER_KILL) for page in theirs),
        )
        figures["burst_s"] = time.monotonic() - began
        figures["burst_records"] = sum(page.burst for page in pages)
        await browser.close()
    return pages


class Automation:
    """The feedback sensor evaluated over and over against a real Dagster instance, as the daemon would; its first
    run request is launched as a retraining (in a thread of its own) while the chat servers keep writing."""

    def __init__(self, parts, instance, resources):
        self.parts, self.instance, self.resources = parts, instance, resources
        self.ticks: list[tuple[float, list, str | None]] = []
        self.request = self.result = self.error = None
        self.stop, self.retrained = threading.Event(), threading.Event()
        self.threads = [threading.Thread(target=self._sense, daemon=True)]

    def _sense(self):
        [sensor_def] = self.parts["sensors"]
        try:
            while not self.stop.is_set():
                requests, why = tick(sensor_def, self.instance, self.resources["store"])
                self.ticks.append((time.monotonic(), requests, why))
                if requests and self.request is None:
                    self.request = requests[0]
                    retraining = threading.Thread(target=self._retrain, daemon=True)
                    self.threads.append(retraining)
                    retraining.start()
                self.stop.wait(0.5)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test
            self.error = exc

    def _retrain(self):
        try:
            self.began = time.monotonic()
            self.result = materialize(  # the gate left out: the outcome here does not hang on a tiny model's luck
                self.parts["assets"],
                instance=self.instance,
                resources=self.resources,
                selection=AssetSelection.assets(*[["tiny", n] for n in NAMES]),
                tags=self.request.tags,
                raise_on_error=False,
            )
            self.took = time.monotonic() - self.began
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test
            self.error = exc
        finally:
            self.retrained.set()


def test_two_chat_servers_share_one_postgres_store_under_load_and_a_kill(
    chromium, stub, postgres, resources_for, request, tmp_path
):
    url = postgres.create_database()
    server = stub(lambda n, body: (200, completion(answer(body["messages"][-1]["content"]))))
    started = time.monotonic()
    servers = [ChatServer(name, server.url, url, tmp_path / "chat") for name in ("chat-a", "chat-b")]
    automation = None
    try:
        # the retraining side, set up while the chat servers start: the tiny pipeline (SFT only, one training
        # instead of three on 2 cores; no gain asked for, since the gate is left out), a deployed champion, the
        # task rows the report evaluates on, and the store at the same URL
        tiny_model = request.getfixturevalue("tiny_model")  # built while the chat servers start
        loaded = load(write_pipeline(tmp_path / "defs", tiny_model))
        gate = loaded.feedback.gate.model_copy(update={"min_gain": None})
        pipeline = loaded.model_copy(
            update={"feedback": loaded.feedback.model_copy(update={"objectives": ["sft"], "gate": gate})}
        )
        parts = build_pipeline_defs(pipeline)
        runs = tmp_path / "runs"
        resources = {**resources_for(runs), "store": ArtifactStore(runs_dir=str(runs), feedback_url=url)}
        (tmp_path / "dagster_home").mkdir()
        instance = DagsterInstance.local_temp(str(tmp_path / "dagster_home"))
        deployed = tmp_path / "deployed" / "model"
        shutil.copytree(tiny_model, deployed)
        tracking = resources["tracking"]
        tracking.promote("tiny", tracking.register_model("tiny", deployed, None, {"note": "by hand"}), "by hand")
        assert materialize(
            parts["assets"],
            instance=instance,
            resources=resources,
            selection=AssetSelection.assets(["tiny", "tickets"], ["tiny", "sft_dataset"]),
        ).success

        for chat in servers:
            chat.wait()
        figures: dict = {"boot_s": time.monotonic() - started}
        automation = Automation(parts, instance, resources)
        automation.threads[0].start()
        KILLED.clear()
        pages = asyncio.run(asyncio.wait_for(browse(chromium, servers, figures), 480))
        assert servers[0].proc.returncode == -signal.SIGKILL and servers[1].proc.poll() is None
        assert automation.retrained.wait(480), "the retraining did not finish"
        automation.stop.set()
        for thread in automation.threads:
            thread.join(60)
        if automation.error is not None:
            raise automation.error
    finally:
        if automation is not None:
            automation.stop.set()
        for chat in servers:
            chat.close()

    # count in == count stored: every acknowledged id is stored, whole, as its page sent it; ids run 1..max
    store = PostgresFeedbackStore(url, "tiny")
    rows = store.records()
    by_id = {r["id"]: r for r in rows}
    assert [r["id"] for r in rows] == list(range(1, len(rows) + 1))
    acked = {fid: (page, want) for page in pages for fid, want in page.acks.items()}
    assert len(acked) == sum(len(page.acks) for page in pages), "an id acknowledged twice"
    missing = sorted(set(acked) - set(by_id))
    assert not missing, f"acknowledged but not stored: {missing}"
    for fid, (page, want) in acked.items():
        assert whole(by_id[fid]) == want, (page.name, fid)
    conversations = {}
    for fid, (page, _) in acked.items():
        conversations.setdefault(by_id[fid]["conversation_id"], set()).add(page.name)
    assert sorted(len(names) for names in conversations.values()) == [1] * len(pages), "one conversation a page"
    page_of = {by_id[fid]["conversation_id"]: page for fid, (page, _) in acked.items()}
    # what is stored and was never acknowledged: only a rating the killed process had in flight, whole
    unacked = sorted(set(by_id) - set(acked))
    doomed, survivor = servers
    for fid in unacked:
        page = page_of[by_id[fid]["conversation_id"]]
        assert page.server is doomed and page.pending is not None, (fid, page.name)
        assert whole(by_id[fid]) == page.pending, (fid, page.name)
    assert len(unacked) <= PAGES
    killed_acks = sorted(fid for fid, (page, _) in acked.items() if page.server is doomed)
    # the surviving process went on recording after the kill
    after = [page.after_kill for page in pages if page.server is survivor]
    assert all(n >= AFTER_KILL for n in after), after
    assert max(fid for fid, (page, _) in acked.items() if page.server is survivor) > max(killed_acks + unacked)

    # the retraining: it succeeded on exactly the records the store had up to the watermark it was given
    request, result = automation.request, automation.result
    first, up_to = (int(x) for x in request.tags[RANGE_TAG].split("-"))
    assert result.success and first == 1 and 3 <= up_to < len(rows), (request.tags, len(rows))
    events = {
        e.asset_key.path[-1]: e.metadata
        for e in (ev.event_specific_data.materialization for ev in result.get_asset_materialization_events())
    }
    sft = events["feedback_sft_dataset"]
    assert sft["feedback_up_to"].value == up_to and sft["records"].value == up_to
    used = json.loads((Path(sft["artifact_dir"].value) / "records.json").read_text())
    keys = ("id", "conversation_id", "verdict", "reply", "edited")
    assert [tuple(r[k] for k in keys) for r in used] == [tuple(r[k] for k in keys) for r in rows[:up_to]]
    assert "retrained_report" in events and last_used_id(instance, "tiny") == up_to
    # meanwhile the sensor kept reading: waiting for records first, then (its run going) not asking again
    said = [why or "" for _, requests, why in automation.ticks if not requests]
    assert any("waiting for 3" in why for why in said), said[:5]
    assert any("has not finished" in why for why in said), said[-5:]
    # and afterwards it counts exactly the records above the watermark as new
    [again], _ = tick(parts["sensors"][0], instance, resources["store"])
    assert again.tags[RANGE_TAG] == f"{up_to + 1}-{len(rows)}"
    assert feedback_records(pipeline, resources["store"]).count(after_id=up_to) == len(rows) - up_to

    writes = len(rows)
    began = time.monotonic()  # for scale: one write straight to the store (its connection included), no page
    for i in range(20):
        store.record("figures", [{"role": "user", "content": f"q{i}"}], "r", "up")
    write_ms = (time.monotonic() - began) / 20 * 1000
    written_s = figures["concurrent_s"] + figures["burst_s"]
    print(
        f"\nchat servers on PostgreSQL: {len(pages)} writers (browser pages, {PAGES} per process) across 2 "
        f"`dragon chat-ui` processes (up in {figures['boot_s']:.0f} s).\n"
        f"asking and rating: {figures['concurrent_records']} records (ratings and edits) in "
        f"{figures['concurrent_s']:.1f} s, {figures['concurrent_records'] / figures['concurrent_s']:.2f}/s; "
        f"rating bursts: {figures['burst_records']} acknowledged in {figures['burst_s']:.1f} s, "
        f"{figures['burst_records'] / figures['burst_s']:.2f}/s; in all {writes} records in {written_s:.1f} s; "
        f"{len(acked)} acknowledged, all {len(acked)} stored whole, {len(unacked)} stored unacknowledged; "
        f"ids 1..{writes}, no gap; one write straight to the store takes {write_ms:.0f} ms.\n"
        f"killed -9: {doomed.name} with {figures['in_flight_at_kill']} of its {PAGES} pages' ratings in flight; "
        f"its {len(killed_acks)} acknowledged records all stored, whole, and {len(unacked)} more stored whole whose "
        f"acknowledgement never reached the page; {survivor.name} recorded {sum(after)} more after the kill.\n"
        f"questions whose Enter the page dropped (pressed again): {sum(page.resent for page in pages)}.\n"
        f"retraining: records 1-{up_to} (the sensor's first request, "
        f"{automation.began - figures['writing_began']:.0f} s into the writing), took {automation.took:.0f} s, "
        f"succeeded while {writes - up_to} more records arrived; the sensor ticked {len(automation.ticks)} times "
        f"and afterwards asks for {up_to + 1}-{writes}."
    )
