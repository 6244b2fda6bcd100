"""The evaluation report's held-out rows as an MLflow evaluation (resources/evaluations.py): an evaluation dataset,
base and merged each scored by mlflow.genai.evaluate on the replies the report generated, one trace per row with
the reply and the report's scores, and the UI's Evaluations tab comparing the two runs; all on a real `mlflow
server` on loopback. A server that is down is a recorded failure naming it, and the report keeps its outputs."""

import json
import os
import shutil
from pathlib import Path

import pytest
from dagster import AssetSelection, DagsterInstance, materialize

from dragon_dagster.assets.factory import build_pipeline_defs
from dragon_dagster.engine.evaluate.per_row import REPLIES_FILE, read_replies
from dragon_dagster.engine.pipeline import load
from dragon_dagster.resources import MLflowTracking
from dragon_dagster.resources.evaluations import evaluate_replies, log_evaluation, record_evaluation
from tests.support import CHROMIUM_ARGS, free_port, write_pipeline

DOCS_IMAGES = Path(__file__).parents[2] / "docs" / "images"
WAIT_MS = 90_000  # the MLflow UI and a browser on two shared cores

RECORDS = [
    {
        "row": 0,
        "prompt": "Reset my password",
        "reference": "Open settings and choose reset.",
        "base": {"reply": "I cannot help.", "metrics": {}},
        "merged": {"reply": "Open settings and choose reset.", "metrics": {}},
        "judge": {"vs_base": {"verdict": "a", "reason": "merged follows the reference"}},
    },
    {
        "row": 1,
        "prompt": "Refund please",
        "reference": "Your refund is issued.",
        "base": {"reply": "Your refund is issued.", "metrics": {}},
        "merged": {"reply": "Your refund is issued today.", "metrics": {}},
    },
]


def mlflow_globals() -> tuple:
    from mlflow.tracking import fluent
    from mlflow.tracking._tracking_service import utils

    return utils._tracking_uri, os.environ.get("MLFLOW_TRACKING_URI"), fluent._active_experiment_id


def dataset_rows(client, dataset_id: str) -> tuple[list[str], list[dict]]:
    """An evaluation dataset's experiments and records, read through this client's store (the dataset entity
    would read them through MLflow's global tracking URI)."""
    store = client._tracking_client.store
    return store.get_dataset_experiment_ids(dataset_id), store._load_dataset_records(dataset_id, max_results=None)[0]


def traces_of(client, experiment_id: str, run_id: str) -> dict:
    """A run's evaluation traces by prompt: (reply, {assessment name: value})."""
    out = {}
    for trace in client.search_traces(locations=[experiment_id], run_id=run_id):
        root = trace.data.spans[0]
        scores = {a.name: getattr(a, "value", None) for a in trace.info.assessments}
        out[root.inputs["prompt"]] = (root.outputs, scores)
    return out


def test_replies_become_an_evaluation_dataset_and_a_scored_run_per_model(mlflow_server, tmp_path, capsys):
    from mlflow import MlflowClient

    client = MlflowClient(mlflow_server["url"])
    experiment = client.create_experiment("replies-evaluated")
    replies = tmp_path / REPLIES_FILE
    replies.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    runs = {m: client.create_run(experiment, run_name=f"report: {m}").info.run_id for m in ("base", "merged")}
    before = mlflow_globals()
    done = evaluate_replies(
        mlflow_server["url"], experiment, replies, ["exact", "token_f1"], "replies-evaluated.rows", runs, {"p": "x"}
    )
    assert mlflow_globals() == before, "the tracking URI, its variable and the experiment are put back"
    assert "Evaluation completed" not in capsys.readouterr().out, "MLflow's notebook summary stays off stdout"
    assert done["rows"] == 2 and done["dataset_name"] == "replies-evaluated.rows"
    experiments, rows = dataset_rows(client, done["dataset_id"])
    assert experiments == [experiment]
    assert sorted((r.inputs["prompt"], r.expectations) for r in rows) == sorted(
        (r["prompt"], {"expected_response": r["reference"]}) for r in RECORDS
    )
    for model, run_id in runs.items():
        run = client.get_run(run_id)
        assert run.info.status == "FINISHED"
        assert done["dataset_name"] in {i.dataset.name for i in run.inputs.dataset_inputs}
        traces = traces_of(client, experiment, run_id)
        assert set(traces) == {"Reset my password", "Refund please"}
        for record in RECORDS:
            reply, scores = traces[record["prompt"]]
            assert reply == record[model]["reply"]
            assert scores["exact"] == float(reply == record["reference"])
            assert "token_f1" in scores and scores["expected_response"] == record["reference"]
        assert traces["Reset my password"][1]["judge_merged_vs_base"] == ("win" if model == "merged" else "loss")
        assert "judge_merged_vs_base" not in traces["Refund please"][1], "a row the judge did not see has no verdict"
        assert client.get_run(run_id).data.metrics["exact/mean"] == 0.5, client.get_run(run_id).data.metrics


def test_a_tracking_server_that_is_down_is_recorded_in_the_report_naming_it(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    down = f"http://127.0.0.1:{free_port()}"
    (tmp_path / REPLIES_FILE).write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    report = {"task": "chat", "held_out": True, "rows": 2, "base": {"eval_loss": 1.0}, "merged": {"eval_loss": 0.5}}
    report.update(merged_not_worse=True, samples=[], metrics=[])
    (tmp_path / "report.json").write_text(json.dumps(report))
    before = mlflow_globals()
    evaluation = log_evaluation(MLflowTracking(tracking_uri=down), "p", "evaluation_report", tmp_path, "x", [], {})
    assert mlflow_globals() == before
    assert evaluation["tracking_uri"] == down and f"on the tracking server {down} failed" in evaluation["error"]
    record_evaluation(tmp_path, evaluation)
    markdown = (tmp_path / "report.md").read_text()
    assert "# Evaluation report" in markdown and "| eval_loss | 1.0000 | 0.5000 |" in markdown  # nothing lost
    assert f"**Not logged** in MLflow ({down})" in markdown
    assert json.loads((tmp_path / "report.json").read_text())["mlflow_evaluation"] == evaluation


@pytest.mark.slow  # a tiny chain, its report, and the MLflow UI in a browser: a few minutes on 2 cores
def test_the_report_shows_both_models_rows_in_mlflows_evaluations_tab(
    mlflow_server, tiny_model, tmp_path, monkeypatch, resources_for, chromium
):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server["url"])
    pipeline = load(write_pipeline(tmp_path / "defs", tiny_model, name="evaluated"))
    resources = resources_for(tmp_path / "runs")
    resources["tracking"] = MLflowTracking(runs_dir=str(tmp_path / "runs"), ui_url=mlflow_server["url"])
    (tmp_path / "home").mkdir()
    result = materialize(
        build_pipeline_defs(pipeline)["assets"],
        resources=resources,
        instance=DagsterInstance.local_temp(str(tmp_path / "home")),
        selection=AssetSelection.assets(
            *[["evaluated", n] for n in ("tickets", "sft_dataset", "sft_adapter", "merged_model", "evaluation_report")]
        ),
    )
    assert result.success
    report_dir = Path(result.output_for_node("evaluated__evaluation_report"))
    records = read_replies(report_dir / REPLIES_FILE)
    report = json.loads((report_dir / "report.json").read_text())
    evaluation = report["mlflow_evaluation"]
    assert "error" not in evaluation, evaluation
    assert len(records) == report["rows"] and evaluation["rows"] == len({r["prompt"] for r in records})
    assert evaluation["url"] in (report_dir / "report.md").read_text()
    metadata = result.asset_materializations_for_node("evaluated__evaluation_report")[0].metadata
    assert metadata["mlflow_evaluation"].value == evaluation["url"]
    assert os.environ["MLFLOW_TRACKING_URI"] == mlflow_server["url"], "the variable was not touched"

    from mlflow import MlflowClient

    client = MlflowClient(mlflow_server["url"])
    experiment = client.get_experiment_by_name("evaluated-evaluations").experiment_id  # apart from training's
    assert evaluation["experiment"] == "evaluated-evaluations"
    training = client.get_experiment_by_name("evaluated").experiment_id
    assert not client.search_traces(locations=[training])  # its Traces tab is the chat's turns only
    experiments, rows = dataset_rows(client, evaluation["dataset_id"])
    assert experiments == [experiment] and {r.inputs["prompt"] for r in rows} == {r["prompt"] for r in records}
    for model, run_id in evaluation["runs"].items():
        run = client.get_run(run_id)
        report_run = client.get_run(run.data.tags["report_mlflow_run_id"])
        pipeline_run = client.get_run(report_run.data.tags["mlflow.parentRunId"]).info.run_name
        assert run.info.run_name == f"evaluation_report: {model} · {pipeline_run}" and run.info.status == "FINISHED"
        assert report_run.info.run_name == "evaluation_report"
        traces = traces_of(client, experiment, run_id)
        assert len(traces) == evaluation["rows"]
        for record in records:
            reply, scores = traces[record["prompt"]]
            assert reply == record[model]["reply"]
            for name in report["metrics"]:
                assert scores[name] == pytest.approx(record[model]["metrics"][name]), (model, name)
        judged = [r for r in records if r.get("judge")]
        assert len(judged) == min(5, len(records))  # n_judge's default
        side = {"a": "win", "b": "loss"} if model == "merged" else {"a": "loss", "b": "win"}
        for r in judged:
            verdict = r["judge"]["vs_base"]["verdict"]
            assert traces[r["prompt"]][1]["judge_merged_vs_base"] == side.get(verdict, verdict)

    # the link in the report, in a browser: both runs' rows side by side
    from playwright.sync_api import expect, sync_playwright

    reply = next(r["merged"]["reply"].strip() for r in records if len(r["merged"]["reply"].strip()) >= 4)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        page.goto(evaluation["url"])
        shot = tmp_path / "mlflow-evaluation.png"
        expect(page.get_by_text("Comparing", exact=True).first).to_be_visible(timeout=WAIT_MS)
        close = page.get_by_role("button", name="Close")  # MLflow's assistant panel, open on a first visit
        if close.count():
            close.first.click()
        try:
            for model in ("merged", "base"):
                expect(page.get_by_text(f"evaluation_report: {model}").first).to_be_visible(timeout=WAIT_MS)
        finally:
            page.screenshot(path=str(shot))  # what the page showed, for a failure too
        expect(page.get_by_text(reply.splitlines()[0][:30], exact=False).first).to_be_visible(timeout=WAIT_MS)
        page.wait_for_timeout(2_000)
        page.screenshot(path=str(shot))
        browser.close()
    if os.environ.get("DRAGON_DOCS_SCREENSHOTS"):
        DOCS_IMAGES.mkdir(exist_ok=True)
        shutil.copyfile(shot, DOCS_IMAGES / "mlflow-evaluation.png")
