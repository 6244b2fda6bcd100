"""What people see, in a real browser: the MLflow link the demo prints opens the model-training runs with each
pipeline run's stages nested under it and one held-out-loss chart over every stage; MLflow's Compare page of two
pipeline runs opens without an error; a Dagster asset page shows the stage's loss plot."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import requests
from dagster import AssetKey

from dragon_dagster.assets.launch import materialize_pipeline
from dragon_dagster.assets.reuse import FRESH_TAG
from dragon_dagster.resources import ArtifactStore, MLflowTracking, TrainingResource
from tests.support import free_port, healthy, user_project, wait_until

pytestmark = pytest.mark.slow  # two UI servers and a browser: about 2.5 minutes on 2 cores

CHROMIUM_ARGS = ["--no-sandbox", "--disable-dev-shm-usage"]
WAIT_MS = 90_000  # two UIs and a browser on two shared cores
# the docs page that shows the comparison embeds what this test sees (DRAGON_DOCS_SCREENSHOTS=1 refreshes it)
DOCS_IMAGES = Path(__file__).parents[2] / "docs" / "images"


class Server:
    """A UI server process on a free loopback port, stopped with its process group."""

    def __init__(self, argv: list[str], env: dict, log: Path, health: str, cwd: Path | None = None):
        self.port = free_port()
        self.log = log
        argv = [a.replace("{port}", str(self.port)) for a in argv]
        with log.open("w") as out:
            self.proc = subprocess.Popen(
                argv, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT, cwd=cwd, start_new_session=True
            )
        self.url = f"http://127.0.0.1:{self.port}"
        wait_until(lambda: healthy(self.url + health), 180, f"{argv[0]} to answer", alive=self.gone)

    def gone(self) -> str | None:
        code = self.proc.poll()
        return None if code is None else f"exited with {code}:\n{self.log.read_text()[-3000:]}"

    def stop(self) -> None:
        import signal

        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(self.proc.pid, signal.SIGKILL)


def exe(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


@pytest.fixture(scope="module")
def dashboards(materialized, tmp_path_factory):
    """The materialized chain plus a second Dagster run of its report (a second pipeline run in MLflow), MLflow's
    UI on its store and Dagster's webserver on its instance."""
    root = tmp_path_factory.mktemp("dashboards")
    pipeline, runs = materialized["pipeline"], materialized["runs"]
    resources = {
        "store": ArtifactStore(runs_dir=str(runs)),
        "tracking": MLflowTracking(runs_dir=str(runs)),
        "training": TrainingResource(device="cpu"),
    }
    again = materialize_pipeline(  # made anew (not reused): the charts overlay two evaluated pipeline runs
        pipeline,
        resources=resources,
        instance=materialized["instance"],
        only=["evaluation_report"],
        tags={FRESH_TAG: "true"},
    )
    assert again["success"], again
    mlflow = Server(
        [exe("mlflow"), "ui", "--backend-store-uri", f"sqlite:///{runs / 'mlflow.db'}", "--host", "127.0.0.1"]
        + ["--port", "{port}", "--workers", "1"],
        {},
        root / "mlflow.log",
        "/health",
    )
    project = root / "project"
    defs = user_project(project)
    shutil.copytree(Path(pipeline.source_file).parent, defs / pipeline.name)
    (project / "workspace.yaml").write_text(
        "load_from:\n  - python_module: {module_name: trainlab.definitions, working_directory: .}\n"
    )
    dagster = Server(
        [exe("dagster-webserver"), "-h", "127.0.0.1", "-p", "{port}", "-w", "workspace.yaml"],
        {
            "DAGSTER_HOME": str(materialized["instance"].root_directory),
            "PYTHONPATH": str(project),
            "DRAGON_RUNS_DIR": str(runs),
        },
        root / "dagster.log",
        "/server_info",
        cwd=project,
    )
    try:
        yield {
            **materialized,
            "tracking": MLflowTracking(runs_dir=str(runs), ui_url=mlflow.url),
            "second_run": again["run_id"],
            "dagster": dagster.url,
            "root": root,
        }
    finally:
        mlflow.stop()
        dagster.stop()


@pytest.fixture
def page(chromium):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        page.set_default_timeout(WAIT_MS)
        yield page
        browser.close()


def pipeline_runs(tracking, pipeline: str) -> list:
    client = tracking.client()
    return client.search_runs([tracking.experiment_id(pipeline)], "tags.level = 'pipeline'")


def test_the_printed_mlflow_link_opens_training_runs_nested_under_pipeline_runs_with_a_held_out_chart(dashboards, page):
    from playwright.sync_api import expect

    tracking, pipeline = dashboards["tracking"], dashboards["pipeline"].name
    parents = pipeline_runs(tracking, pipeline)
    assert len(parents) == 2  # the chain's run and the report's second run
    client = tracking.client()
    first = next(p for p in parents if p.data.tags["dagster_run_id"] == dashboards["outcome"]["run_id"])
    nested = f"tags.`mlflow.parentRunId` = '{first.info.run_id}'"
    children = client.search_runs([tracking.experiment_id(pipeline)], nested)
    assert {c.data.tags["stage"] for c in children} == {"sft_adapter", "merged_model", "base", "evaluation_report"}
    for run in [*parents, *children]:  # Source, User, description and at least one artifact on every run
        assert run.data.tags["mlflow.source.name"].startswith("dagster: ")
        assert run.data.tags["mlflow.user"] and run.data.tags["mlflow.note.content"]
        assert client.list_artifacts(run.info.run_id), run.info.run_name
    # one held-out NLL series over base -> sft_adapter -> merged on the pipeline run, each point on its model's run
    series = [m.value for m in client.get_metric_history(first.info.run_id, "heldout/nll")]
    assert len(series) == 3 and series[-1] < series[0]
    by_stage = {c.data.tags["stage"]: c.data.metrics.get("heldout/nll") for c in children}
    assert by_stage["base"] == pytest.approx(series[0]) and by_stage["sft_adapter"] == pytest.approx(series[1])
    assert by_stage["merged_model"] == pytest.approx(series[2])

    link = tracking.runs_url(pipeline)  # what `dragon demo` prints
    assert "workflowType=machine_learning" in link
    page.goto(link)
    # the model-training view, not the GenAI traces overview (which has no runs table)
    expect(page.get_by_role("columnheader", name="Run Name").first).to_be_visible(timeout=WAIT_MS)
    expect(page.get_by_text(first.info.run_name, exact=False).first).to_be_visible(timeout=WAIT_MS)
    assert "machine_learning" in page.url
    # the stage runs sit under their pipeline run: expand it
    row = page.get_by_role("row").filter(has_text=first.info.run_name)
    row.locator("button[data-component-id*='runnamecellrenderer']").first.click()
    for stage in ("sft_adapter", "merged_model", "evaluation_report"):
        expect(page.get_by_role("link", name=stage, exact=True).first).to_be_visible(timeout=WAIT_MS)
    # the charts view, as a new visitor sees it (pipeline runs collapsed): one held-out NLL chart, a line per
    # pipeline run over its stages
    page = page.context.browser.new_context(viewport={"width": 1600, "height": 1000}).new_page()  # fresh storage
    page.goto(tracking.runs_url(pipeline, charts=True))
    close = page.get_by_role("button", name="Close")  # MLflow's assistant panel, open on a first visit
    expect(page.get_by_placeholder("Search metric charts")).to_be_visible(timeout=WAIT_MS)
    if close.count():
        close.first.click()
    # its first card: the held-out NLL along the chain with each model named (section "chain", before "eval")
    chain = page.get_by_text("chain/heldout_nll", exact=True).first
    expect(chain).to_be_visible(timeout=WAIT_MS)
    sections = [page.get_by_text(name, exact=True).first for name in ("chain", "eval")]  # the section headers
    expect(sections[1]).to_be_attached(timeout=WAIT_MS)
    assert sections[0].bounding_box()["y"] < chain.bounding_box()["y"] < sections[1].bounding_box()["y"]
    expect(page.locator("img[src*='chain~heldout_nll']").first).to_be_visible(timeout=WAIT_MS)  # drawn
    # charts render as they scroll into view: the chart search brings the held-out ones to the top
    page.get_by_placeholder("Search metric charts").fill("heldout/nll")
    expect(page.get_by_text("heldout/nll", exact=True).first).to_be_visible(timeout=WAIT_MS)
    expect(page.locator(".js-plotly-plot").first).to_be_visible(timeout=WAIT_MS)  # drawn, not loading
    page.wait_for_timeout(2_000)
    shot = dashboards["root"] / "mlflow-charts.png"
    page.screenshot(path=str(shot))
    if os.environ.get("DRAGON_DOCS_SCREENSHOTS"):
        DOCS_IMAGES.mkdir(exist_ok=True)
        shutil.copyfile(shot, DOCS_IMAGES / "mlflow-charts.png")


def test_run_pages_show_their_parent_or_none_and_the_server_never_answers_404(dashboards, page):
    """A pipeline run has no parent (its page has no "Parent run" waiting for one); a stage's page names its
    pipeline run as its parent; MLflow's server answered every request the pages made (a parent tag that is not a
    run id made it answer 404, over and over, for as long as the page was open)."""
    from playwright.sync_api import expect

    tracking, pipeline = dashboards["tracking"], dashboards["pipeline"].name
    first = next(
        p for p in pipeline_runs(tracking, pipeline) if p.data.tags["dagster_run_id"] == dashboards["outcome"]["run_id"]
    )
    assert "mlflow.parentRunId" not in first.data.tags
    [sft] = tracking.client().search_runs(
        [tracking.experiment_id(pipeline)],
        f"tags.`mlflow.parentRunId` = '{first.info.run_id}' and tags.stage = 'sft_adapter'",
    )
    # the runs the pages ask the server for (themselves, a parent) that it does not have (users/current, which
    # every page of a server without authentication asks for, answers 404 by design)
    failed = []
    page.on(
        "response", lambda r: failed.append(f"{r.status} {r.url}") if "/runs/get" in r.url and r.status >= 400 else None
    )
    page.goto(tracking.run_url(pipeline, first.info.run_id))
    expect(page.get_by_role("heading", name=first.info.run_name).first).to_be_visible(timeout=WAIT_MS)
    page.wait_for_timeout(3_000)  # time for the page's follow-up requests, a parent's among them
    expect(page.get_by_text("Parent run", exact=True)).to_have_count(0)
    page.goto(tracking.run_url(pipeline, sft.info.run_id))
    expect(page.get_by_text("Parent run", exact=True).first).to_be_visible(timeout=WAIT_MS)
    expect(page.get_by_role("link", name=first.info.run_name).first).to_be_visible(timeout=WAIT_MS)
    assert not failed, failed


def test_mlflow_compares_two_pipeline_runs_without_an_error(dashboards, page):
    from playwright.sync_api import expect

    tracking, pipeline = dashboards["tracking"], dashboards["pipeline"].name
    ids = [r.info.run_id for r in pipeline_runs(tracking, pipeline)]
    experiment = tracking.experiment_id(pipeline)
    url = (f"{tracking.ui}/#/compare-runs?runs={json.dumps(ids)}&experiments={json.dumps([experiment])}").replace(
        " ", ""
    )
    page.goto(url)
    expect(page.get_by_text("heldout/nll").first).to_be_visible(timeout=WAIT_MS)
    expect(page.get_by_text("Artifacts", exact=False).first).to_be_visible(timeout=WAIT_MS)
    assert not page.get_by_text("Something went wrong").count()


def test_a_dagster_asset_page_shows_the_stage_loss_plot(dashboards, page):
    from playwright.sync_api import expect

    event = dashboards["instance"].get_latest_materialization_event(AssetKey(["tiny", "sft_adapter"]))
    metadata = event.asset_materialization.metadata
    assert metadata["loss_curve"].value.startswith("![")
    assert "data:image/png;base64," in metadata["loss_curve"].value
    assert requests.get(dashboards["dagster"] + "/server_info", timeout=30).ok
    page.goto(f"{dashboards['dagster']}/assets/tiny/sft_adapter?view=events")
    try:  # a fresh browser meets Dagster's "Join the community" dialog first
        page.get_by_role("button", name="Skip").click(timeout=15_000)
    except Exception:
        pass
    name = page.get_by_text("loss_curve", exact=True).first
    expect(name).to_be_visible(timeout=WAIT_MS)
    # Markdown this long sits behind a "[Show Markdown]" link, which opens it in a dialog
    name.locator("xpath=ancestor::tr").get_by_text("[Show Markdown]").click()
    shown = page.locator("img[src^='data:image/png']").first
    expect(shown).to_be_visible(timeout=WAIT_MS)
    assert shown.evaluate("img => img.naturalWidth") > 100  # a decoded PNG, not a broken image
