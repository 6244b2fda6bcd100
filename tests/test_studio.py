"""The studio in a real Chromium (issue 43): a CSV nobody bundled, mapped by template, previewed, saved as a
component that loads, run to SUCCESS in Dagster with its loss curve on the page; a bad mapping named on the page
with nothing written, and an upload over the limit refused with the limit."""

from __future__ import annotations

import json
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
from dragon_dagster.page_serving import PageServing
from tests.support import CHROMIUM_ARGS, WAIT_MS, free_port, seed_mlflow_store, user_project

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
    seed_mlflow_store(runs / "mlflow.db")  # the run's process tracks into it: its tables made once
    (tmp_path / "home").mkdir()
    instance = DagsterInstance.from_config(str(tmp_path / "home"))  # the run's process opens it too
    studio = studio_page.Studio(defs, runs, str(tiny_model), resources=resources_for(runs), instance=instance)
    app = studio_page.build_studio(studio)
    url = studio_page.start(app, PageServing(port=free_port(), block=False, quiet=True))
    try:
        headers = requests.get(url, timeout=10).headers
        assert "frame-ancestors 'none'" in headers["Content-Security-Policy"] and headers["X-Frame-Options"] == "DENY"
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1800})
            page.set_default_timeout(WAIT_MS)
            page.goto(url)
            upload_status, saved = page.locator("#upload_status"), page.locator("#save_status")
            upload = page.locator("#data_file input[type=file]")

            upload.set_input_files(str(big))  # over the limit: refused, with the limit
            expect(page.get_by_text(f"{MAX_BYTES // (1024 * 1024)}", exact=False).first).to_be_visible()
            expect(upload_status).not_to_contain_text("rows;")

            upload.set_input_files(str(data))
            expect(upload_status).to_contain_text("lamps.csv: 40 rows; columns device, issue, fix")
            expect(page.locator("#head")).to_contain_text("flickers after update 0")
            page.locator("#name textarea").fill("lamps")
            page.locator("#prompt textarea").fill("{device}: {isue}")  # a typo in a template
            page.locator("#response textarea").fill("fix")
            page.locator("#save").click()
            expect(saved).to_contain_text("prompt mapping '{device}: {isue}' names missing column(s) ['isue']")
            assert not (defs / "lamps").exists()  # nothing written

            page.locator("#prompt textarea").fill("{device}: {issue}")
            page.locator("#steps input").fill(str(STEPS))
            page.locator("#rank input").fill("4")
            page.locator("#preview").click()
            expect(page.locator("#preview_status")).to_contain_text("Checked")
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
            page.locator("#save").click()
            expect(saved).to_contain_text(f"Wrote {defs / 'lamps' / 'defs.yaml'}")
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
            # the image loads lazily: below the fold (the form's rows above it) it stays unloaded, so bring it in view
            page.locator("#loss").scroll_into_view_if_needed()
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
        shutil.copyfile(tmp_path / "studio.png", DOCS_IMAGES / "studio.png")


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
        # long replies shared across devices identify a row: a leak (a short shared reply would be a coincidence)
        (
            "{device}",
            "fix",
            {"fix": [f"Hold the reset button on the back for {i % 3 + 5} seconds." for i in range(40)]},
            "held-out rows have a prompt",
        ),
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
    seed_mlflow_store(runs / "mlflow.db")  # the run's process tracks into it: its tables made once
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
    """`dragon studio --password-env`: the page is behind the login, and so is every chat page it opens. It writes
    into the defs folder the project's code location loads, and refuses any other with that one."""
    from click.testing import CliRunner

    from dragon_dagster import studio
    from dragon_dagster.cli import main

    served = []
    monkeypatch.setattr(studio, "build_studio", lambda page: page)
    monkeypatch.setattr(studio, "start", lambda page, serving: served.append((page, serving)))
    monkeypatch.setenv("DRAGON_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    defs = user_project(tmp_path / "project")
    monkeypatch.chdir(tmp_path / "project")
    args = ["studio", "--defs", str(defs), "--host", "0.0.0.0", "--password-env", "STUDIO_PW"]
    out = CliRunner().invoke(main, args, env={"STUDIO_PW": "s3cret"})
    assert out.exit_code == 0, out.output
    [(page, serving)] = served
    assert (serving.password, serving.host) == ("s3cret", "0.0.0.0") and "s3cret" not in out.output
    assert (page.serving.password, page.serving.username, page.serving.host) == ("s3cret", "dragon", "0.0.0.0")
    assert page.defs_dir == defs.resolve()

    refused = CliRunner().invoke(main, ["studio", "--defs", str(tmp_path / "defs")])
    assert refused.exit_code != 0 and len(served) == 1
    assert f"{tmp_path / 'defs'} is not the folder this project's code location loads, {defs}" in refused.output
    assert not (tmp_path / "defs").exists()


def test_the_studio_writes_where_the_code_location_loads(tmp_path):
    """In this checkout the code location loads dragon_dagster/defs (not ./defs); in a user's project, the defs
    module its pyproject names, wherever the studio is started from within it."""
    from dragon_dagster.studio.project import loaded_defs_dir

    root = Path(__file__).resolve().parents[1]
    assert loaded_defs_dir(root) == root / "dragon_dagster" / "defs"
    defs = user_project(tmp_path / "project", name="lab")
    assert loaded_defs_dir(tmp_path / "project") == defs.resolve()


PERSONA = "You are Pip, a patient lamp technician."


def paraphrases(path: Path, topics: int = 12, persona: str | None = PERSONA) -> Path:
    """Three wordings of each question with one answer: split by prompt, held-out answers repeat train's."""
    forms = ["How do I reset lamp {q}?", "What resets lamp {q}?", "Lamp {q} is stuck: how do I reset it?"]
    rows = [
        {
            "question": form.format(q=q),
            "answer": f"Hold the button of lamp {q} for {q + 3} seconds.",
            "topic": f"lamp {q}",
            "persona": persona or f"You are technician {k}.",
        }
        for q in range(topics)
        for k, form in enumerate(forms)
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_the_leak_is_fixed_on_the_page_and_its_figures_stay_in_view(tmp_path, tiny_model):
    """The leak check's error names the page's fields with the overlap beside it; 'Group by' fixes the split and
    'Allow leakage' lets it through; the saved YAML carries what was chosen."""
    data = paraphrases(tmp_path / "para.jsonl")
    defs = tmp_path / "defs"
    defs.mkdir()
    studio = studio_page.Studio(defs, tmp_path / "runs", str(tiny_model))
    values = studio_values(data, "question", "answer", system="persona")
    rows, _, figures, _, status = studio.preview(*values)
    assert rows is None and "held-out prompts also in train: **0%**, answers: **100%**" in figures
    assert "Pick a 'Group by' column" in status and "tick 'Allow leakage'" in status
    assert "group_by" not in status and "allow_leakage" not in status  # no YAML key the page has no field for
    assert studio.save(*values)[1] == status and list(defs.iterdir()) == []

    _, _, figures, yaml_text, status = studio.preview(*values, "topic", False)
    assert status.startswith("Checked") and "answers: **0%**" in figures and "group_by: topic" in yaml_text
    assert f"System prompt: `persona` is the same on every row; the chat on the model sends it: {PERSONA!r}" in figures
    _, _, figures, yaml_text, status = studio.preview(*values, "", True)
    assert status.startswith("Checked") and "answers: **100%** (allowed" in figures
    assert "allow_leakage: true" in yaml_text and "group_by" not in yaml_text

    studio.save(*values, "topic", False)
    dataset = load(defs / "lamps" / "defs.yaml").stage("sft_dataset")
    assert (dataset.group_by, dataset.allow_leakage, dataset.system) == ("topic", False, "persona")


def test_a_system_column_is_the_rows_value_never_its_name(tmp_path, tiny_model):
    """`system` mapped to a column: the pipeline's system prompt (what chat and feedback send) is the value every
    row shares, none when rows differ (said on the page), and no registered prompt is the column's name."""
    defs = tmp_path / "defs"
    defs.mkdir()
    studio = studio_page.Studio(defs, tmp_path / "runs", str(tiny_model))
    shared, varied = (
        paraphrases(tmp_path / "shared" / "para.jsonl"),
        paraphrases(tmp_path / "varied" / "para.jsonl", persona=None),
    )
    for data, name, system in ((shared, "shared", PERSONA), (varied, "varied", None)):
        values = studio_values(data, "question", "answer", system="persona")
        values[1] = name
        _, status = studio.save(*values, "topic", False)
        assert status.startswith("Wrote"), status
        pipeline = load(defs / name / "defs.yaml")
        assert pipeline.system_prompt() == system and pipeline.system_prompt_dataset() is None
    _, _, figures, _, _ = studio.preview(*values, "topic", False)
    assert "`persona` differs between rows" in figures and "sends none" in figures
    templated = load(defs / "shared" / "defs.yaml")
    templated.stage("sft_dataset").system = "{persona} Answer briefly."
    assert templated.system_prompt() == f"{PERSONA} Answer briefly."


@pytest.mark.slow
@pytest.mark.timeout(900)  # the pipeline's whole run through `dg launch`: minutes where the CPUs are shared
def test_a_paraphrased_file_fixed_on_the_page_runs_from_dg_and_chats_with_its_persona(
    chromium, tiny_model, resources_for, tmp_path
):
    """Issue 58, as a newcomer meets it in a real Chromium, in a dg project of their own with its webserver up: a
    refused upload clears the last file's preview; a paraphrased file trips the leak check, whose error names the
    page's field, and picking 'Group by' fixes it live; Save writes where the code location loads, so the webserver
    lists the job after the reload the page asks for, `dg list defs` lists it and the command the page prints runs
    it; the chat on its model sends the persona column's value as the system prompt, and feedback records it."""
    import subprocess
    import sys

    from playwright.sync_api import expect, sync_playwright

    from dragon_dagster.chat_target import feedback_store
    from dragon_dagster.studio.project import loaded_defs_dir
    from tests.assets.test_webserver import Webserver

    project = tmp_path / "project"
    defs = user_project(project)
    big = tmp_path / "big.csv"
    with big.open("wb") as f:
        f.truncate(MAX_BYTES + 1)
    server = Webserver(tmp_path, project, program=("dagster-webserver",))  # runs: tmp_path/runs
    runs = tmp_path / "runs"
    resources = resources_for(runs)
    studio = studio_page.Studio(
        loaded_defs_dir(project), runs, str(tiny_model), resources, dagster_url=f"http://127.0.0.1:{server.port}"
    )
    app = studio_page.build_studio(studio)
    url = studio_page.start(app, PageServing(port=free_port(), block=False, quiet=True))
    env = {**server.env, "COLUMNS": "200"}
    env.pop("VIRTUAL_ENV", None)

    def dg(*args: str) -> subprocess.CompletedProcess:
        command = [str(Path(sys.executable).parent / "dg"), *args]
        return subprocess.run(command, cwd=project, env=env, capture_output=True, text=True, timeout=400)

    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1800})
            page.set_default_timeout(WAIT_MS)
            page.goto(url)
            upload = page.locator("#data_file input[type=file]")
            head, rows, figures = page.locator("#head"), page.locator("#rows"), page.locator("#figures")
            preview_status = page.locator("#preview_status")

            upload.set_input_files(str(lamps(tmp_path / "lamps.csv")))
            expect(page.locator("#upload_status")).to_contain_text("lamps.csv: 40 rows")
            page.locator("#prompt textarea").fill("{device}: {issue}")
            page.locator("#response textarea").fill("fix")
            page.locator("#name textarea").fill("para")
            page.locator("#preview").click()
            expect(rows).to_contain_text("flickers after update")
            page.locator("#data_file").get_by_role("button", name="Clear").click()  # to drop another file
            upload.set_input_files(str(big))  # refused: the last file's rows and preview are gone with it
            expect(page.get_by_text(f"{MAX_BYTES // (1024 * 1024)}", exact=False).first).to_be_visible()
            expect(head).not_to_contain_text("flickers after update")
            expect(rows).not_to_contain_text("flickers after update")
            expect(figures).not_to_contain_text("held out")
            expect(preview_status).not_to_contain_text("Checked")
            page.locator(".toast-close").click()

            upload.set_input_files(str(paraphrases(tmp_path / "para.jsonl")))
            expect(page.locator("#upload_status")).to_contain_text("para.jsonl: 36 rows")
            page.locator("#prompt textarea").fill("question")
            page.locator("#response textarea").fill("answer")
            page.locator("#system textarea").fill("persona")
            page.locator("#steps input").fill("3")
            page.locator("#rank input").fill("4")
            page.locator("#preview").click()
            expect(preview_status).to_contain_text("Pick a 'Group by' column")  # beside the button, in its words
            expect(figures).to_contain_text("answers: 100%")
            page.locator("#group_by input").click()
            page.get_by_role("option", name="topic", exact=True).click()
            expect(preview_status).to_contain_text("Checked")  # checked again as it was picked
            expect(figures).to_contain_text("answers: 0%")
            expect(figures).to_contain_text(f"the chat on the model sends it: '{PERSONA}'")
            expect(page.locator("#yaml")).to_contain_text("group_by: topic")
            page.screenshot(path=str(tmp_path / "studio-preview.png"), full_page=True)
            printed = re.search(r"dg launch --job (\S+)", figures.inner_text())

            page.locator("#save").click()
            expect(page.locator("#save_status")).to_contain_text(
                f"Wrote {defs / 'para' / 'defs.yaml'}", timeout=120_000
            )
            expect(page.locator("#save_status")).to_contain_text("reloaded trainlab: its UI lists para_pipeline")

            listed = dg("list", "defs", "--json")
            assert listed.returncode == 0 and '"para_pipeline"' in listed.stdout, listed.stderr[-3000:]
            assert '"para/sft_adapter"' in listed.stdout
            launched = dg("launch", "--job", printed.group(1))
            assert launched.returncode == 0 and "RUN_SUCCESS" in launched.stdout + launched.stderr, launched.stderr[
                -3000:
            ]

            page.locator("#chat").click()  # the chat on what `dg launch` made
            link = page.get_by_role("link", name="Chat with para's merged_model")
            expect(link).to_be_visible(timeout=60_000)
            expect(page.locator("#studio_status")).to_contain_text(f"sends system prompt: '{PERSONA}'")
            chat = browser.new_page()
            chat.set_default_timeout(WAIT_MS)
            chat.goto(link.get_attribute("href"))
            expect(chat.locator("#system textarea")).to_have_value(PERSONA)
            chat.locator("#message textarea").fill("How do I reset lamp 4?")
            chat.locator("#message textarea").press("Enter")
            expect(chat.locator("#chatbot .message-row")).to_have_count(2, timeout=120_000)
            expect(chat.locator("#status")).to_contain_text("Context", timeout=120_000)
            chat.locator("#chatbot").get_by_label("Like", exact=True).first.click()
            expect(chat.locator("#status")).to_contain_text("Recorded thumbs up on reply 1")
            browser.close()
    finally:
        studio.close()
        app.close()
        server.stop()
    system = {"role": "system", "content": PERSONA}
    [record] = feedback_store("para", resources["store"]).records()
    assert record["turns"][0] == system and "persona" not in [t["content"] for t in record["turns"]]
    client = resources["tracking"].client()
    [trace] = client.search_traces(locations=[client.get_experiment_by_name("para").experiment_id])
    assert json.loads(trace.data.request)["messages"][0] == system  # the chat's first request
    if os.environ.get("DRAGON_DOCS_SCREENSHOTS"):
        DOCS_IMAGES.mkdir(exist_ok=True)
        shutil.copyfile(tmp_path / "studio-preview.png", DOCS_IMAGES / "studio-preview.png")


def test_messages_name_the_users_file_and_a_refused_file_clears_the_last_one(tmp_path, tiny_model):
    """An upload lives in a temporary folder of Gradio's: messages name the file as the user knows it. A file that
    cannot be read clears the previous file's rows, columns and preview."""
    uploaded = tmp_path / "gradio" / "5f2c9a" / "empty.csv"  # where Gradio keeps an upload: a folder per file
    uploaded.parent.mkdir(parents=True)
    uploaded.write_text("")
    studio = studio_page.Studio(tmp_path / "defs", tmp_path / "runs", str(tiny_model))
    head, picker, status, *shown = studio.inspect(str(uploaded))
    assert head is None and picker["choices"] == [] and shown == [None, "", "", "", "", ""]  # rows ... Save's status
    messages = [status, studio.preview(*studio_values(uploaded))[-1], studio.save(*studio_values(uploaded))[-1]]
    for message in messages:
        assert message.startswith("**Error:** empty.csv") and str(tmp_path) not in message, message

    head, picker, status, *_ = studio.inspect(str(lamps(tmp_path / "lamps.csv")))
    assert len(head) == 5 and [c for _, c in picker["choices"]] == ["", "device", "issue", "fix"]
    assert studio.inspect(None)[0] is None  # the file removed: nothing of it stays
