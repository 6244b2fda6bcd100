"""The studio in a real Chromium (issue 43): a CSV nobody bundled, mapped by template, previewed, saved as a
component that loads, run to SUCCESS in Dagster with its loss curve on the page; a bad mapping named on the page
with nothing written, and an upload over the limit refused with the limit."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
import requests
from dagster import DagsterInstance

from dragon_dagster import studio as studio_page
from dragon_dagster.engine.pipeline import load
from dragon_dagster.engine.pipeline.draft import MAX_BYTES
from tests.support import CHROMIUM_ARGS, WAIT_MS, free_port

DOCS_IMAGES = Path(__file__).resolve().parents[1] / "docs" / "images"
STEPS = 100  # enough for the curve to be drawn twice while it trains (a point every 5 steps)


def lamps(path: Path, rows: int = 40) -> Path:
    pd.DataFrame(
        {
            "device": [f"Lamp {i % 8}" for i in range(rows)],
            "issue": [f"flickers after update {i}" for i in range(rows)],
            "fix": [f"Roll back firmware {i} in Settings > Device." for i in range(rows)],
        }
    ).to_csv(path, index=False)
    return path


@pytest.mark.slow
@pytest.mark.timeout(720)
def test_from_a_csv_to_a_trained_model_in_the_studio(chromium, tiny_model, resources_for, tmp_path, monkeypatch):
    from playwright.sync_api import expect, sync_playwright

    monkeypatch.setenv("MLFLOW_UI_URL", f"http://127.0.0.1:{free_port()}")  # no MLflow UI answers: no link to it

    data = lamps(tmp_path / "lamps.csv")
    big = tmp_path / "big.csv"
    with big.open("wb") as f:
        f.truncate(MAX_BYTES + 1)
    defs, runs = tmp_path / "project" / "defs", tmp_path / "runs"
    defs.mkdir(parents=True)
    (tmp_path / "home").mkdir()
    instance = DagsterInstance.from_config(str(tmp_path / "home"))  # the run's process opens it too
    studio = studio_page.Studio(defs, runs, str(tiny_model), resources=resources_for(runs), instance=instance)
    app = studio_page.build_studio(studio)
    url = studio_page.start(app, port=free_port(), block=False, quiet=True)
    try:
        headers = requests.get(url, timeout=10).headers
        assert "frame-ancestors 'none'" in headers["Content-Security-Policy"] and headers["X-Frame-Options"] == "DENY"
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1800})
            page.set_default_timeout(WAIT_MS)
            page.goto(url)
            status = page.locator("#studio_status")
            upload = page.locator("#data_file input[type=file]")

            upload.set_input_files(str(big))  # over the limit: refused, with the limit
            expect(page.get_by_text(f"{MAX_BYTES // (1024 * 1024)}", exact=False).first).to_be_visible()
            expect(status).not_to_contain_text("rows;")

            upload.set_input_files(str(data))
            expect(status).to_contain_text("lamps.csv: 40 rows; columns device, issue, fix")
            expect(page.locator("#head")).to_contain_text("flickers after update 0")
            page.locator("#name textarea").fill("lamps")
            page.locator("#prompt textarea").fill("{device}: {isue}")  # a typo in a template
            page.locator("#response textarea").fill("fix")
            page.locator("#save").click()
            expect(status).to_contain_text("prompt mapping '{device}: {isue}' names missing column(s) ['isue']")
            assert not (defs / "lamps").exists()  # nothing written

            page.locator("#prompt textarea").fill("{device}: {issue}")
            page.locator("#steps input").fill(str(STEPS))
            page.locator("#rank input").fill("4")
            page.locator("#preview").click()
            expect(status).to_contain_text("Checked")
            expect(page.locator("#rows")).to_contain_text("Lamp 0: flickers after update 0")
            expect(page.locator("#rendered textarea")).to_have_value(
                re.compile(
                    r"<\|im_start\|>user\nLamp 0: flickers after update 0<\|im_end\|>\n<\|im_start\|>assistant\nRoll"
                )
            )  # through the model's chat template
            expect(page.locator("#figures")).to_contain_text("held out")
            expect(page.locator("#yaml")).to_contain_text("name: lamps")
            for close in page.locator(".toast-close").all():  # the refused upload's notice (unless it timed out)
                close.click()  # read: out of the docs' picture
            page.screenshot(path=str(tmp_path / "studio-preview.png"), full_page=True)
            page.locator("#save").click()
            expect(status).to_contain_text(f"Wrote {defs / 'lamps' / 'defs.yaml'}")
            pipeline = load(defs / "lamps" / "defs.yaml")
            sft = pipeline.stage("sft_adapter")
            assert sft.args.max_steps == STEPS and sft.lora.r == 4

            # an edit after Save: Run says it would start what was saved, and offers to save the form first
            page.locator("#learning_rate input").fill("0.0003")
            page.locator("#run").click()
            note = page.locator("#run_note")
            expect(note).to_contain_text("Not saved: the form differs from")
            expect(note).to_contain_text("stages.sft_adapter.args.learning_rate")
            assert not studio.runs  # nothing started
            page.locator("#save_and_run").click()
            expect(note).to_contain_text("Running lamps")
            expect(page.locator("#save_and_run")).to_be_hidden()
            assert load(defs / "lamps" / "defs.yaml").stage("sft_adapter").args.learning_rate == 3.0e-4
            # the curve is drawn while the adapter trains, and drawn again with the points that came after
            curve = page.locator("#loss img")
            expect(curve).to_be_visible(timeout=240_000)  # a loaded machine takes its time to load the model
            first = curve.get_attribute("src")
            page.wait_for_function(
                "old => { const img = document.querySelector('#loss img'); return img && img.src !== old }",
                arg=page.evaluate("() => document.querySelector('#loss img').src"),
                timeout=60_000,
            )
            redrawn_running = "SUCCESS" not in note.inner_text()
            expect(page.locator("#stages")).to_contain_text("RUNNING")
            expect(note).to_contain_text("SUCCESS", timeout=300_000)
            assert redrawn_running and curve.get_attribute("src") != first
            expect(page.locator("#stages")).to_contain_text("lamps/sft_adapter")
            logged = [r["step"] for r in studio.loss_rows("lamps")]
            assert logged[-1] == STEPS and len(logged) >= 20  # a point every twentieth of the run (and the first)
            assert page.locator("#loss img").evaluate("img => img.naturalWidth") > 300
            run_id = studio.runs["lamps"].launched.run_id
            expect(note).to_contain_text(f"Dagster run {run_id}")
            # run in a process of the studio, with no MLflow UI up: said so, and no link to a page nobody serves
            expect(note).to_contain_text("dg dev")
            expect(note).to_contain_text("no MLflow UI answers")
            assert note.locator("a").count() == 0
            page.screenshot(path=str(tmp_path / "studio.png"), full_page=True)

            page.locator("#chat").click()  # try it: the chat page on the merged model
            link = page.get_by_role("link", name="Chat with lamps's merged_model")
            expect(link).to_be_visible(timeout=60_000)  # the chat page loads its model first
            chat = browser.new_page()
            chat.set_default_timeout(WAIT_MS)
            chat.goto(link.get_attribute("href"))
            chat.locator("#message textarea").fill("Lamp 3: flickers after update 3")
            chat.locator("#message textarea").press("Enter")
            expect(chat.locator("#chatbot .message-row")).to_have_count(2, timeout=120_000)  # asked, and answered
            # the whole reply given (the status then says what context went with it): no generation left running
            expect(chat.locator("#status")).to_contain_text("Context", timeout=120_000)
            assert str(Path(studio.chats["lamps"][0]).parent) == str(runs / "artifacts" / "lamps" / "merged_model")

            page.locator("#run").click()  # again, as saved: every stage reused, and the page says so
            expect(note).to_contain_text("SUCCESS, nothing trained", timeout=120_000)
            expect(note).to_contain_text(f"every stage reused what run {run_id} made")
            for stage in ("data", "sft_dataset", "sft_adapter", "merged_model", "evaluation_report"):
                row = page.get_by_role("row", name=re.compile(rf"^lamps\/{stage} REUSED [\d.]+ made by run {run_id}$"))
                expect(row).to_be_visible()  # its checks ran again, on what was reused: their rows read SUCCESS
            browser.close()
    finally:
        studio.close()
        app.close()
    rerun, run = instance.get_runs()
    assert run.job_name == rerun.job_name == "lamps_pipeline" and run.is_success and rerun.is_success
    if os.environ.get("DRAGON_DOCS_SCREENSHOTS"):
        DOCS_IMAGES.mkdir(exist_ok=True)
        for shot in ("studio.png", "studio-preview.png"):
            shutil.copyfile(tmp_path / shot, DOCS_IMAGES / shot)


def studio_values(path, prompt="{device}: {issue}", response="fix", recipe="supervised", steps=3, **more) -> list:
    """The page's inputs, in the order its buttons send them."""
    mapping = {"layout": "auto", "conversations": "", "system": "", "rejected": "", **more}
    return [
        str(path),
        "lamps",
        "",  # the studio's model
        mapping["layout"],
        mapping["conversations"],
        prompt,
        response,
        mapping["system"],
        mapping["rejected"],
        recipe,
        steps,
        2.0e-4,
        4,
        more.get("tune_steps", 2),
        more.get("beta"),
        more.get("rewards", ["contains"]),
    ]


@pytest.mark.parametrize(
    ("prompt", "response", "columns", "problem"),
    [
        ("{device}: {issue}", "answer", {}, "answer"),  # a missing column, named
        ("{device}: {isue}", "fix", {}, "names missing column(s) ['isue']"),  # a template naming an unknown column
        ("{device}: {issue}", "fix", {"fix": [""] * 40}, "empty reply"),  # an empty response column
        ("{device}", "fix", {"fix": [f"Reset it {i % 3}." for i in range(40)]}, "held-out rows have a prompt"),
    ],
)
def test_a_bad_mapping_is_shown_on_the_page_and_nothing_is_written(
    tmp_path, tiny_model, prompt, response, columns, problem
):
    path = lamps(tmp_path / "lamps.csv")
    if columns:
        pd.read_csv(path).assign(**columns).to_csv(path, index=False)
    defs = tmp_path / "defs"
    defs.mkdir()
    studio = studio_page.Studio(defs, tmp_path / "runs", str(tiny_model))
    values = studio_values(path, prompt, response)
    _, status = studio.save(*values)
    assert status.startswith("**Error:**") and problem in status, status
    assert studio.preview(*values)[-1] == status  # the preview says the same
    assert list(defs.iterdir()) == []  # nothing written, not even a staging folder


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_cancel_stops_a_studio_run_at_its_step_and_keeps_the_checkpoint(
    tiny_model, resources_for, tmp_path, monkeypatch
):
    """Run in a process of the studio (no webserver answers), cancelled while the adapter trains: Dagster records
    the run CANCELED, the worker is gone, and the trainer saved where it stopped; the page says so."""
    from tests.support import wait_until, workers

    monkeypatch.setenv("MLFLOW_UI_URL", f"http://127.0.0.1:{free_port()}")  # no MLflow UI answers

    defs, runs = tmp_path / "defs", tmp_path / "runs"
    defs.mkdir()
    (tmp_path / "home").mkdir()
    instance = DagsterInstance.from_config(str(tmp_path / "home"))
    studio = studio_page.Studio(
        defs, runs, str(tiny_model), resources_for(runs), instance, dagster_url=f"http://127.0.0.1:{free_port()}"
    )
    studio.save(*studio_values(lamps(tmp_path / "lamps.csv"), steps=2000))
    assert "a process of the studio" in studio.launch("lamps")  # nothing answers at the Dagster URL
    wait_until(lambda: len(studio.loss_rows("lamps")) >= 3, 180, "3 logged steps")
    _, _, status = studio.follow("lamps")
    assert "Running lamps" in status and "sft_adapter: step" in status and "s left in it" in status  # the ETA
    assert "Cancelling lamps" in studio.cancel("lamps")
    launched = studio.runs["lamps"].launched
    assert launched.status() == "CANCELED"
    assert instance.get_run_by_id(launched.run_id).status.value == "CANCELED"
    wait_until(lambda: not workers(str(runs)), 30, "the worker to end")
    saved = {
        int(p.name.split("-")[1]): p for p in (runs / "checkpoints" / "lamps" / "sft_adapter").glob("*/checkpoint-*")
    }
    assert 3 <= max(saved) < 2000  # where it stopped (and any periodic saves before it)
    assert not list(runs.glob("artifacts/lamps/sft_adapter/2*")), "no artifact for a cancelled stage"
    table, _, status = studio.follow("lamps")
    # the stage reads as Dagster's run does (its step is a failure inside a CANCELED run), with the checkpoint kept
    stage = table.set_index("stage").loc["lamps/sft_adapter"]
    kept = saved[max(saved)]
    assert (stage["status"], stage["note"]) == ("CANCELED", f"checkpoint kept: {kept}")
    assert "FAILURE" not in set(table["status"]) and "FAILURE" not in status
    assert status.startswith(f"**CANCELED** at lamps/sft_adapter: checkpoint kept: {kept}"), status
    assert "resume: true" in status and str(launched.log) in status and "](" not in status  # no page serves it


def test_dragon_studio_serves_its_chat_pages_behind_its_own_login(monkeypatch, tmp_path):
    """`dragon studio --password-env`: the page is behind the login, and so is every chat page it opens."""
    from click.testing import CliRunner

    from dragon_dagster import studio
    from dragon_dagster.cli import main

    served = []
    monkeypatch.setattr(studio, "build_studio", lambda page: page)
    monkeypatch.setattr(studio, "start", lambda page, **kw: served.append((page, kw)))
    monkeypatch.setenv("DRAGON_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    args = ["studio", "--defs", str(tmp_path / "defs"), "--host", "0.0.0.0", "--password-env", "STUDIO_PW"]
    out = CliRunner().invoke(main, args, env={"STUDIO_PW": "s3cret"})
    assert out.exit_code == 0, out.output
    [(page, options)] = served
    assert (options["password"], options["host"]) == ("s3cret", "0.0.0.0") and "s3cret" not in out.output
    assert (page.password, page.username, page.host) == ("s3cret", "dragon", "0.0.0.0")
    assert (tmp_path / "defs").is_dir() and page.defs_dir == (tmp_path / "defs").resolve()
