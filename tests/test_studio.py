"""The studio in a real Chromium (issue 43): a CSV nobody bundled, mapped by template, previewed, saved as a
component that loads, run to SUCCESS in Dagster with its loss curve on the page; a bad mapping named on the page
with nothing written, and an upload over the limit refused with the limit."""

from __future__ import annotations

import os
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
@pytest.mark.timeout(420)
def test_from_a_csv_to_a_trained_model_in_the_studio(chromium, tiny_model, resources_for, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    data = lamps(tmp_path / "lamps.csv")
    big = tmp_path / "big.csv"
    with big.open("wb") as f:
        f.truncate(MAX_BYTES + 1)
    defs, runs = tmp_path / "project" / "defs", tmp_path / "runs"
    defs.mkdir(parents=True)
    instance = DagsterInstance.ephemeral()
    studio = studio_page.Studio(defs, runs, str(tiny_model), resources=resources_for(runs), instance=instance)
    app = studio_page.build_studio(studio)
    url = studio_page.start(app, port=free_port(), block=False, quiet=True)
    try:
        headers = requests.get(url, timeout=10).headers
        assert "frame-ancestors 'none'" in headers["Content-Security-Policy"] and headers["X-Frame-Options"] == "DENY"
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1600})
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
            page.locator("#steps input").fill("3")
            page.locator("#rank input").fill("4")
            page.locator("#preview").click()
            expect(status).to_contain_text("Checked")
            expect(page.locator("#rows")).to_contain_text("Lamp 0: flickers after update 0")
            expect(page.locator("#figures")).to_contain_text("held out")
            expect(page.locator("#yaml")).to_contain_text("name: lamps")
            page.locator("#save").click()
            expect(status).to_contain_text(f"Wrote {defs / 'lamps' / 'defs.yaml'}")
            pipeline = load(defs / "lamps" / "defs.yaml")
            assert pipeline.stage("sft_adapter").args.max_steps == 3 and pipeline.stage("sft_adapter").lora.r == 4

            page.locator("#run").click()
            expect(status).to_contain_text("SUCCESS", timeout=300_000)
            expect(page.locator("#stages")).to_contain_text("lamps/sft_adapter")
            assert len(studio.loss_rows("lamps")) == 3  # a point per step
            expect(page.locator("#loss img")).to_be_visible()  # the curve, drawn
            assert page.locator("#loss img").evaluate("img => img.naturalWidth") > 300
            expect(status).to_contain_text("dragon chat-ui lamps")
            run_id = instance.get_runs()[0].run_id
            assert page.get_by_role("link", name="the run in Dagster").get_attribute("href").endswith(f"/runs/{run_id}")
            assert "/#/experiments/" in page.get_by_role("link", name="its MLflow runs").get_attribute("href")
            shot = tmp_path / "studio.png"
            page.screenshot(path=str(shot), full_page=True)
            browser.close()
    finally:
        app.close()
    [run] = instance.get_runs()
    assert run.job_name == "lamps_pipeline" and run.is_success
    if os.environ.get("DRAGON_DOCS_SCREENSHOTS"):
        DOCS_IMAGES.mkdir(exist_ok=True)
        shutil.copyfile(shot, DOCS_IMAGES / "studio.png")
