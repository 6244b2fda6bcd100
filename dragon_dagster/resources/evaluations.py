"""The evaluation report's held-out rows as an MLflow evaluation: an evaluation dataset of the rows, and base and
merged each evaluated by `mlflow.genai.evaluate` on the replies the report already generated (no model runs
again, no LLM is called): one run per model, one trace per row with the reply, and this project's task metrics
and the pairwise judge's verdict as assessments. The UI's Evaluations tab compares the two runs row by row.

mlflow.genai works on MLflow's process-wide state (tracking URI, active run), not on a client: `mlflow_scope`
sets it for the call and restores it after, under a lock, so nothing leaks into the rest of the process."""

from __future__ import annotations

import io
import logging
from contextlib import ExitStack, redirect_stdout
from pathlib import Path

from ..engine.evaluate import metrics as task_metrics
from ..engine.evaluate.per_row import MODELS, read_replies
from ..engine.text.uris import without_password
from .mlflow_scope import mlflow_scope
from .run_colours import colour_tag

logger = logging.getLogger(__name__)
# mlflow.genai.evaluate says at INFO that it turns tracing on for the evaluation and which integrations it traced
# (Bedrock's, here where no Bedrock client exists): its own workings, with nothing for the report's reader to do.
for _name in ("mlflow.models.evaluation.utils.trace", "mlflow.bedrock"):
    logging.getLogger(_name).setLevel(logging.WARNING)

RUN_KIND_TAG = "evaluation"  # base | merged, on each evaluation run
REPORT_RUN_TAG = "report_mlflow_run_id"  # the report's run, on each evaluation run


def evaluation_experiment(pipeline: str) -> str:
    """The experiment of a pipeline's MLflow evaluations (datasets, base and merged runs, their row traces): apart
    from the pipeline's own, whose charts compare training runs and whose Traces tab holds the chat's turns."""
    return f"{pipeline}-evaluations"


REFERENCE = "expected_response"  # MLflow's name for a reference answer in expectations


class MLflowEvaluationError(RuntimeError):
    """The MLflow evaluation of the report's rows failed (a tracking server down, a store without datasets)."""


def metric_scorer(name: str):
    """A task metric of the report (engine/evaluate/metrics.py) as an MLflow scorer on a reply and its reference:
    the same function, so each row's score is the one the report's mean is made of."""
    from mlflow.genai.scorers import scorer

    function = task_metrics.METRICS[name]

    def score(inputs: dict, outputs: str, expectations: dict | None = None) -> float | None:
        reference = (expectations or {}).get(REFERENCE)
        return None if not reference else float(function(outputs, reference, inputs.get("prompt", "")))

    return scorer(score, name=name, description=f"The report's task metric {name}: the reply against the reference.")


def lookup_scorer(name: str, values: dict[tuple[str, str], object], description: str):
    """A precomputed per-row value (the judge's verdict, a reward) as a scorer, looked up by (prompt, reply):
    MLflow hands a scorer the row's inputs and outputs, not its index. None (no assessment) for rows without one."""
    from mlflow.entities import Feedback
    from mlflow.genai.scorers import scorer

    def score(inputs: dict, outputs: str):
        value = values.get((inputs.get("prompt", ""), outputs))
        if isinstance(value, tuple):  # (value, rationale)
            return Feedback(value=value[0], rationale=value[1] or None)
        return value

    return scorer(score, name=name, description=description)


# the judge's verdict (merged as A) from each model's side; unparsed: the judge's answers could not be read
JUDGE_SIDE = {
    "base": {"a": "loss", "b": "win", "tie": "tie", "unparsed": "unparsed"},
    "merged": {"a": "win", "b": "loss", "tie": "tie", "unparsed": "unparsed"},
}


def scorers_for(model: str, records: list[dict], metric_names: list[str]) -> list:
    """The report's measures of model's replies as scorers: each task metric, the judge's verdict against the
    other model from this model's side (win, loss, tie, unparsed; only the rows judged), and a prompt row's reward."""
    out = [metric_scorer(n) for n in metric_names]
    verdicts, rewards = {}, {}
    for r in records:
        key = (r["prompt"], r[model]["reply"])
        judged = (r.get("judge") or {}).get("vs_base")
        if judged and judged["verdict"] in JUDGE_SIDE[model]:
            verdicts[key] = (JUDGE_SIDE[model][judged["verdict"]], judged.get("reason"))
        if r[model].get("reward") is not None:
            rewards[key] = float(r[model]["reward"])
    if verdicts:
        out.append(
            lookup_scorer(
                "judge_merged_vs_base",
                verdicts,
                "The report's pairwise judge, merged against base in both orders, from this model's side.",
            )
        )
    if rewards:
        out.append(lookup_scorer("reward", rewards, "The weighted reward of the merged model's chain."))
    return out


def eval_rows(records: list[dict], model: str) -> list[dict]:
    """mlflow.genai.evaluate's rows for one model: the prompt, the model's reply as the output (so no
    predict_fn: the report's replies are scored, not regenerated), the reference as the expectation."""
    out = []
    for r in records:
        row = {"inputs": {"prompt": r["prompt"]}, "outputs": r[model]["reply"]}
        if r.get("reference"):
            row["expectations"] = {REFERENCE: r["reference"]}
        out.append(row)
    return out


def evaluate_replies(
    uri: str,
    experiment_id: str,
    replies: Path,
    metric_names: list[str],
    dataset_name: str,
    runs: dict[str, str],
    dataset_tags: dict[str, str],
) -> dict:
    """The report's replies.jsonl as an MLflow evaluation dataset and one mlflow.genai.evaluate per model, each
    into its run (runs: model -> a run already created in the experiment, which the evaluation fills and ends).
    Returns {"dataset_id", "dataset_name", "rows"}; raises MLflowEvaluationError naming the tracking URI."""
    import mlflow
    from mlflow.entities import DatasetInput, InputTag
    from mlflow.genai.datasets import create_dataset

    records = read_replies(replies)
    if not records:
        raise MLflowEvaluationError(f"{replies} has no rows to evaluate in MLflow")
    try:
        with mlflow_scope(uri, experiment_id):
            dataset = create_dataset(name=dataset_name, experiment_id=experiment_id, tags=dataset_tags)
            seen, unique = set(), []
            for r in records:  # MLflow keeps one record per inputs: a repeated prompt is one row of the dataset
                if r["prompt"] not in seen:
                    seen.add(r["prompt"])
                    unique.append({k: v for k, v in eval_rows([r], "base")[0].items() if k != "outputs"})
            dataset.merge_records(unique)
            for model in MODELS:
                with mlflow.start_run(run_id=runs[model]):
                    scorers = scorers_for(model, records, metric_names)
                    # evaluate prints a notebook-style summary to stdout ("Evaluation completed", the run's name and
                    # id) under a demo's table and a benchmark's JSON line: the report links the evaluation instead
                    with redirect_stdout(io.StringIO()):
                        mlflow.genai.evaluate(data=eval_rows(records, model), scorers=scorers)
                    # the run's input is the evaluation dataset (evaluate logs the rows it was given as "dataset")
                    used = DatasetInput(
                        dataset._to_mlflow_entity(), tags=[InputTag("mlflow.data.context", "evaluation")]
                    )
                    mlflow.MlflowClient().log_inputs(runs[model], datasets=[used])
                    mlflow.log_artifact(str(replies))  # the compare page fails on a run without artifacts
            done = {"dataset_id": dataset.dataset_id, "dataset_name": dataset.name, "rows": len(unique)}
    except MLflowEvaluationError:
        raise
    except Exception as e:
        raise MLflowEvaluationError(
            f"the MLflow evaluation of {replies} on the tracking server {without_password(uri)} failed: "
            f"{type(e).__name__}: {e}"
        ) from e
    return done


def evaluation_url(ui_url: str, experiment_id: str, runs: dict[str, str]) -> str:
    """The UI's Evaluations tab with the merged run selected and compared to the base run: a row per held-out
    prompt, both replies and both models' scores side by side."""
    return (
        f"{ui_url.rstrip('/')}/#/experiments/{experiment_id}/evaluation-runs?selectedRunUuid={runs['merged']}"
        f"&compareToRunUuid={runs['base']}"
    )


def pipeline_run_name(tracking, report_run: str | None) -> str:
    """The name of the pipeline run the report's run is nested in (`support_quick 1a2b3c4d`), which the evaluation
    runs carry in theirs: the Evaluations tab then tells one pipeline run's pair from another's. "" when none."""
    if not report_run:
        return ""
    client = tracking.client()
    parent = client.get_run(report_run).data.tags.get("mlflow.parentRunId")
    return client.get_run(parent).info.run_name if parent else ""


def log_evaluation(
    tracking,
    pipeline: str,
    stage: str,
    report_dir: Path,
    name: str,
    metric_names: list[str],
    tags: dict[str, str],
    parent: str | None = None,
    source: str = "",
) -> dict:
    """The report in report_dir (its replies.jsonl) as an MLflow evaluation in the pipeline's evaluations
    experiment (evaluation_experiment): the dataset `<pipeline>.<stage>.<name>` (name: the report's artifact
    directory, unique per report) and the runs `<stage>: base · <pipeline run>` and `<stage>: merged · <pipeline
    run>` (the name of the pipeline run the report's is nested in), tagged with the report's run
    (parent). Not nested under it: MLflow's Evaluations tab lists no run whose parent is not an evaluation run
    itself, and the report's run is in the pipeline's own experiment. Returns what the report records:
    {"tracking_uri", "experiment", "dataset_id", "dataset_name", "rows", "runs": {model: run id}, "url"}; on a
    failure (a server down, a store without evaluation datasets) {"tracking_uri", "error"} and the runs it made
    end FAILED: the report's own outputs stand either way."""
    from ..engine.evaluate.per_row import REPLIES_FILE

    uri, shown, runs = tracking.uri, tracking.shown_uri, {}
    try:
        experiment = tracking.experiment_id(evaluation_experiment(pipeline))
        replies = Path(report_dir) / REPLIES_FILE
        if not replies.exists():
            raise MLflowEvaluationError(f"the report wrote no {REPLIES_FILE} in {report_dir}: no rows to log")
        label = pipeline_run_name(tracking, parent)
        with ExitStack() as owned:  # each run, once made, ends with the evaluation: FAILED if it fails
            for model in MODELS:
                runs[model] = owned.enter_context(
                    tracking.started(
                        evaluation_experiment(pipeline),
                        f"{stage}: {model}" + (f" · {label}" if label else ""),
                        {
                            **tags,
                            RUN_KIND_TAG: model,
                            "evaluation_of": stage,
                            "level": "evaluation",
                            REPORT_RUN_TAG: parent,
                            **colour_tag(model, tags.get("dagster_run_id")),
                        },
                        {"model": model},
                        description=f"The {model} model's replies to the held-out rows of {stage}, scored row by row "
                        "(the Evaluations tab; compare with the other model's run).",
                        source=source,
                    )
                )
            done = evaluate_replies(
                uri,
                experiment,
                replies,
                metric_names,
                dataset_name=f"{pipeline}.{stage}.{name}",
                runs=runs,
                dataset_tags={**tags, "evaluation_of": stage},
            )
    except Exception as e:
        error = (
            str(e)
            if isinstance(e, MLflowEvaluationError)
            else f"the MLflow evaluation of {report_dir} on the tracking server {shown} failed: {type(e).__name__}: {e}"
        )
        logger.warning(error)
        return {"tracking_uri": shown, "error": error[:2000]}
    return {
        "tracking_uri": shown,
        "experiment": evaluation_experiment(pipeline),
        **done,
        "runs": runs,
        "url": evaluation_url(tracking.ui, experiment, runs),
    }


def record_evaluation(report_dir: Path, evaluation: dict) -> None:
    """The evaluation in report.json (mlflow_evaluation) and report.md (its section, with the link), rewritten
    in the report's staging directory before it is finalized."""
    import json

    from ..engine.stages.evaluate.markdown import markdown

    path = Path(report_dir) / "report.json"
    report = json.loads(path.read_text())
    report["mlflow_evaluation"] = evaluation
    path.write_text(json.dumps(report, indent=2, ensure_ascii=False))
    (Path(report_dir) / "report.md").write_text(markdown(report))
