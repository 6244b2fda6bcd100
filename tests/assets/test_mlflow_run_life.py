"""No MLflow run is left RUNNING: one context manager (MLflowTracking.owning, and started, which opens the run it
owns) ends a run FINISHED when its block returns, FAILED with the error when it raises, KILLED when it is
cancelled; stages broken on purpose end every run they opened. A real sqlite store, a real Dagster instance."""

from __future__ import annotations

from pathlib import Path

import pytest

from dragon_dagster.resources import ArtifactStore, MLflowTracking, TrainingResource
from tests.support import write_pipeline


def runs_of(tracking: MLflowTracking, experiment: str) -> dict:
    """The experiment's runs by name: (status, tags)."""
    client = tracking.client()
    found = client.search_runs([tracking.experiment_id(experiment)])
    return {r.info.run_name: (r.info.status, r.data.tags) for r in found}


def test_a_run_ends_finished_failed_with_its_error_or_killed_on_cancel(tmp_path):
    from dagster._core.errors import DagsterExecutionInterruptedError

    from dragon_dagster.engine.train.trainer import Cancelled

    tracking = MLflowTracking(runs_dir=str(tmp_path / "runs"))
    with tracking.started("life", "fine", {"stage": "fine"}, {"lr": 0.1}) as fine:
        tracking.log_metrics(fine, {"loss": 1.0})
    stage, parent = tracking.start_run("life", "stage", {}, {}), tracking.start_run("life", "parent", {}, {})
    with pytest.raises(ValueError, match="the data is broken"):
        with tracking.owning(parent, where="sft_adapter"), tracking.owning(stage):
            raise ValueError("the data is broken")
    cancels = {
        "terminated": DagsterExecutionInterruptedError(),  # what Dagster raises in a step when the run is terminated
        "interrupted": KeyboardInterrupt(),
        "stopped": Cancelled("training stopped on request after saving a checkpoint"),
    }
    for name, cancel in cancels.items():
        with pytest.raises(type(cancel)), tracking.started("life", name, {}, {}):
            raise cancel
    with pytest.raises(RuntimeError), tracking.owning(None):  # a run that was never opened: nothing to end
        raise RuntimeError("before the run")
    runs = runs_of(tracking, "life")
    assert runs["fine"][0] == "FINISHED" and "error" not in runs["fine"][1]
    assert runs["stage"][0] == "FAILED" and runs["stage"][1]["error"] == "ValueError: the data is broken"
    # the pipeline run outlives its stages: its error says which stage failed
    assert runs["parent"][0] == "FAILED" and runs["parent"][1]["error"] == "sft_adapter: ValueError: the data is broken"
    for name in cancels:
        assert runs[name][0] == "KILLED" and "error" not in runs[name][1], name
    assert runs["terminated"][1]["cancelled"] == "DagsterExecutionInterruptedError"
    assert runs["stopped"][1]["cancelled"] == "Cancelled: training stopped on request after saving a checkpoint"


def test_a_training_stage_whose_worker_fails_ends_its_runs_failed(tiny_model, tmp_path):
    """The SFT stage's worker cannot run (its interpreter exits at once): its MLflow run and the pipeline run end
    FAILED with the worker's error, through the real stage asset."""
    from dagster import DagsterInstance

    from dragon_dagster.assets.launch import materialize_pipeline
    from dragon_dagster.engine.pipeline import load

    pipeline = load(write_pipeline(tmp_path / "defs", tiny_model))
    runs, instance = tmp_path / "runs", DagsterInstance.ephemeral()
    tracking = MLflowTracking(runs_dir=str(runs))

    def materialize(stages: list[str], training: TrainingResource) -> dict:
        resources = {"store": ArtifactStore(runs_dir=str(runs)), "tracking": tracking, "training": training}
        return materialize_pipeline(pipeline, resources=resources, instance=instance, only=stages)

    assert materialize(["tickets", "sft_dataset"], TrainingResource(device="cpu"))["success"]
    broken = TrainingResource(device="cpu", python="/bin/false", warm_start=False)
    assert not materialize(["sft_adapter"], broken)["success"]
    found = runs_of(tracking, pipeline.name)
    assert found and all(status != "RUNNING" for status, _ in found.values()), found
    # the datasets' Dagster run has a pipeline run of its own (FINISHED); the failed stage's is the one it nests under
    pipelines = {name for name, (_, tags) in found.items() if tags.get("level") == "pipeline"}
    [parent] = [n for n in pipelines if found[n][1].get("dagster_run_id") == found["sft_adapter"][1]["dagster_run_id"]]
    assert {found[n][0] for n in pipelines - {parent}} == {"FINISHED"}
    assert found["sft_adapter"][0] == found[parent][0] == "FAILED"
    assert "exited with code 1" in found["sft_adapter"][1]["error"]
    assert found[parent][1]["error"].startswith("sft_adapter: ") and "exited with code 1" in found[parent][1]["error"]


def test_a_report_stage_whose_input_is_broken_leaves_no_run_running(tiny_model, tmp_path):
    """The report stage opens the pipeline's MLflow run before its work; a merged model that is not one (no
    manifest) fails it, and the pipeline run ends FAILED, naming the stage and the problem."""
    from dagster import DagsterInstance, asset, materialize

    from dragon_dagster.assets.report import run_report_stage
    from dragon_dagster.engine.pipeline import load

    pipeline = load(write_pipeline(tmp_path / "defs", tiny_model))
    (tmp_path / "not_merged").mkdir()
    runs = tmp_path / "runs"
    tracking = MLflowTracking(runs_dir=str(runs))

    @asset(name="evaluation_report")
    def report(context, store: ArtifactStore, tracking: MLflowTracking, training: TrainingResource) -> str:
        stage = pipeline.stage("evaluation_report")
        merged, dataset = str(tmp_path / "not_merged"), str(tmp_path / "no_dataset")
        return run_report_stage(context, pipeline, stage, merged, dataset, store, tracking, training).value

    result = materialize(
        [report],
        resources={
            "store": ArtifactStore(runs_dir=str(runs)),
            "tracking": tracking,
            "training": TrainingResource(device="cpu"),
        },
        instance=DagsterInstance.ephemeral(),
        raise_on_error=False,
    )
    assert not result.success
    found = runs_of(tracking, pipeline.name)
    [(status, tags)] = found.values()  # the pipeline run: the stage failed before any run of its own
    assert tags["level"] == "pipeline" and status == "FAILED", found
    assert tags["error"].startswith("evaluation_report: ") and str(Path(tmp_path / "not_merged")) in tags["error"]


def test_a_stage_run_nests_under_the_pipeline_run_with_its_data_and_both_end_with_the_block(tiny_model, tmp_path):
    """stage_runs.stage_run, the way every stage opens its runs: the stage's run is nested under the Dagster run's
    pipeline run, its source names the job and asset, the dataset's split files are its dataset inputs, and an
    error in the block ends both FAILED, the pipeline run's error naming the stage."""
    from dagster import DagsterInstance, asset, materialize

    from dragon_dagster.assets.stage_runs import stage_run
    from dragon_dagster.engine.pipeline import load

    pipeline = load(write_pipeline(tmp_path / "defs", tiny_model))
    data = tmp_path / "sft_dataset" / "artifact"
    data.mkdir(parents=True)
    (data / "train.jsonl").write_text('{"prompt": "Refund please"}\n')
    (data / "eval.jsonl").write_text('{"prompt": "Where is my order"}\n')
    tracking = MLflowTracking(runs_dir=str(tmp_path / "runs"))
    opened = {}

    @asset(name="sft_adapter")
    def stage(context, tracking: MLflowTracking) -> str:
        tags, params = {"stage": "sft_adapter"}, {"lr": 0.1}
        with stage_run(context, pipeline, tracking, "sft_adapter", tags, params, "a stage", dataset=str(data)) as run:
            opened.update(id=run.id, parent=run.parent)
            raise ValueError("the data is broken")

    result = materialize(
        [stage], resources={"tracking": tracking}, instance=DagsterInstance.ephemeral(), raise_on_error=False
    )
    assert not result.success
    client = tracking.client()
    run, parent = client.get_run(opened["id"]), client.get_run(opened["parent"])
    assert run.data.tags["mlflow.parentRunId"] == opened["parent"] and parent.data.tags["level"] == "pipeline"
    assert run.data.tags["mlflow.source.name"] == "dagster: __ephemeral_asset_job__ / sft_adapter"
    assert run.info.status == parent.info.status == "FAILED"
    assert run.data.tags["error"] == "ValueError: the data is broken"
    assert parent.data.tags["error"] == "sft_adapter: ValueError: the data is broken"
    contexts = {d.dataset.name: [] for d in run.inputs.dataset_inputs}
    for logged in run.inputs.dataset_inputs:
        contexts[logged.dataset.name] += [t.value for t in logged.tags if t.key == "mlflow.data.context"]
    assert {name: sorted(found) for name, found in contexts.items()} == {"sft_dataset": ["evaluation", "training"]}


def test_an_evaluation_that_fails_ends_its_runs_failed_with_the_error(tmp_path):
    """The report's MLflow evaluation fails on replies it cannot read (a row without the models' replies): the
    report records the failure, and the base and merged runs it made end FAILED, saying why."""
    import json

    from dragon_dagster.engine.evaluate.per_row import REPLIES_FILE
    from dragon_dagster.resources.evaluations import evaluation_experiment, log_evaluation

    (tmp_path / REPLIES_FILE).write_text(json.dumps({"row": 0, "prompt": "Refund please"}) + "\n")
    tracking = MLflowTracking(runs_dir=str(tmp_path / "runs"))
    evaluation = log_evaluation(tracking, "p", "evaluation_report", tmp_path, "x", [], {})
    assert "error" in evaluation
    found = runs_of(tracking, evaluation_experiment("p"))
    assert set(found) == {"evaluation_report: base", "evaluation_report: merged"}
    for status, tags in found.values():
        assert status == "FAILED" and tags["error"] == f"MLflowEvaluationError: {evaluation['error']}"


def test_a_merge_whose_worker_fails_ends_its_run_and_the_pipeline_run_failed(chain_copy):
    """The merge opens the run the registered version would link to; its worker cannot run, so that run and the
    pipeline run it nests under end FAILED with the worker's error (the built chain's adapter, merged anew)."""
    from dragon_dagster.assets.launch import materialize_pipeline
    from dragon_dagster.assets.reuse import FRESH_TAG

    pipeline, tracking = chain_copy["pipeline"], chain_copy["tracking"]
    before = {r.info.run_id for r in tracking.client().search_runs([tracking.experiment_id(pipeline.name)])}
    resources = {
        "store": ArtifactStore(runs_dir=str(chain_copy["runs"])),
        "tracking": tracking,
        "training": TrainingResource(device="cpu", python="/bin/false", warm_start=False),
    }
    outcome = materialize_pipeline(
        pipeline, resources=resources, instance=chain_copy["instance"], only=["merged_model"], tags={FRESH_TAG: "true"}
    )
    assert not outcome["success"]
    client = tracking.client()
    new = [r for r in client.search_runs([tracking.experiment_id(pipeline.name)]) if r.info.run_id not in before]
    by_level = {r.data.tags.get("level", r.info.run_name): r for r in new}
    assert set(by_level) == {"pipeline", "merged_model"}, {r.info.run_name for r in new}
    merge, parent = by_level["merged_model"], by_level["pipeline"]
    assert merge.info.status == parent.info.status == "FAILED"
    assert "exited with code 1" in merge.data.tags["error"]
    assert parent.data.tags["error"].startswith("merged_model: ")
