"""What a tracking run records, as MLflow's own entities: params flattened from settings, metrics, and the
run's data as dataset inputs."""

from __future__ import annotations

import hashlib
import json
import math
import time
from pathlib import Path

from pydantic import BaseModel


def flatten(prefix: str, values: dict) -> dict[str, str]:
    """Nested settings as MLflow params: dotted names, values as text of at most 500 characters."""
    out = {}
    for key, value in values.items():
        name = f"{prefix}.{key}" if prefix else key
        if isinstance(value, BaseModel):  # hardware, speed: the settings models, logged field by field
            value = value.model_dump(mode="json")
        if isinstance(value, dict):
            out.update(flatten(name, value))
        else:
            out[name] = str(value)[:500]
    return out


def params(values: dict) -> list:
    """values (nested settings) as MLflow Params (log_batch splits them into the batches its store takes)."""
    from mlflow.entities import Param

    return [Param(k, v) for k, v in flatten("", values).items()]


def metrics(values: dict, step: int, finite_only: bool, model_id: str | None) -> list:
    """The numbers among values as MLflow Metrics at step, stamped now; finite_only leaves out NaN and inf."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    return [
        Metric(k, float(v), now, step, model_id=model_id)
        for k, v in values.items()
        if isinstance(v, (int, float)) and (math.isfinite(v) or not finite_only)
    ]


def column_type(value) -> str:
    """An MLflow column-spec type for a JSON value (messages and other nested values as string)."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "long"
    if isinstance(value, float):
        return "double"
    return "string"


def dataset_inputs(dataset_dir: Path, name: str, files: dict[str, Path]) -> list:
    """MLflow dataset inputs (a run's Dataset column and lineage): one per split file, named after the dataset
    asset, with the file's digest and the artifact directory as its source. files: MLflow context ("training",
    "evaluation") -> JSONL file; missing files are left out."""
    from mlflow.entities import Dataset, DatasetInput, InputTag

    inputs = []
    for context, path in files.items():
        if not Path(path).exists():
            continue
        data = Path(path).read_bytes()
        rows = [json.loads(line) for line in data.splitlines() if line.strip()]
        columns = sorted({key for row in rows for key in row})
        first = {key: next((r[key] for r in rows if r.get(key) is not None), None) for key in columns}
        dataset = Dataset(
            name=name,
            digest=hashlib.sha256(data).hexdigest()[:16],
            source_type="local",
            source=json.dumps({"uri": str(dataset_dir), "file": Path(path).name}),
            schema=json.dumps(  # MLflow's column spec, which its dataset drawer shows
                {"mlflow_colspec": [{"name": c, "type": column_type(first[c]), "required": False} for c in columns]}
            ),
            profile=json.dumps({"num_rows": len(rows)}),
        )
        inputs.append(DatasetInput(dataset, tags=[InputTag("mlflow.data.context", context)]))
    return inputs
