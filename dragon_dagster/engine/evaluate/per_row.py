"""The report's replies row by row (replies.jsonl): each held-out prompt, its reference, both models' replies with
their task metrics (and reward), and the pairwise judge's verdict where the row was judged.

The report's tables are means; this file keeps what they average, so the replies can be read, and scored
elsewhere (an MLflow evaluation), without generating them again."""

from __future__ import annotations

import json
from pathlib import Path

from . import metrics as task_metrics

REPLIES_FILE = "replies.jsonl"
MODELS = ("base", "merged")


def per_row(results: dict, metric_names: list[str], judged: dict | None = None) -> list[dict]:
    """One record per row from the worker's results {"base"|"merged": {"samples": [{prompt, reference,
    generated, reward?}]}}. metric_names: the report's task metrics, recomputed per row (the report's figure
    is their mean). judged: {"vs_base": [PairwiseRow, ...]} for the first rows the judge saw (merged as A)."""
    out = []
    samples = {name: results[name]["samples"] for name in MODELS}
    for i, (b, m) in enumerate(zip(samples["base"], samples["merged"])):
        record = {"row": i, "prompt": b["prompt"], "reference": b.get("reference") or ""}
        for name, sample in (("base", b), ("merged", m)):
            reply = sample["generated"]
            scores = {}
            if record["reference"]:  # task metrics compare against a reference: none, none to compute
                scores = {n: task_metrics.METRICS[n](reply, record["reference"], b["prompt"]) for n in metric_names}
            record[name] = {"reply": reply, "metrics": scores}
            if sample.get("reward") is not None:
                record[name]["reward"] = sample["reward"]
        verdicts = {
            against: {"verdict": rows[i].verdict, "reason": rows[i].reason_a_first or rows[i].reason_b_first}
            for against, rows in (judged or {}).items()
            if i < len(rows)
        }
        if verdicts:
            record["judge"] = verdicts
        out.append(record)
    return out


def write_replies(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    return path


def read_replies(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def mlflow_markdown(info: dict) -> list[str]:
    """The report's pointer to its MLflow evaluation (or why there is none): report.json's mlflow_evaluation."""
    lines = ["## In MLflow: both models' replies and scores, row by row", ""]
    if info.get("error"):
        return lines + [
            f"**Not logged** in MLflow ({info.get('tracking_uri')}): {info['error']}",
            "",
            f"Everything else in this report stands; the replies are in `{REPLIES_FILE}` beside it.",
            "",
        ]
    runs = info.get("runs", {})
    return lines + [
        f"[Open the evaluation: merged against base]({info['url']}) (MLflow, experiment "
        f"`{info.get('experiment')}`): {info.get('rows')} held-out rows of the evaluation dataset "
        f"`{info.get('dataset_name')}` (`{info.get('dataset_id')}`), one trace per row on each model's run "
        f"(base `{runs.get('base')}`, merged `{runs.get('merged')}`) with its scores as assessments.",
        "",
    ]
