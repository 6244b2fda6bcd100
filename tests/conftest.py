"""Shared fixtures: a tiny random model built from the embedded tokenizer, a pipeline YAML on it, and one
materialized chain that several tests read (real Dagster instance, real MLflow sqlite store)."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here reaches the hub; fail fast instead of retrying
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TINY_ARGS = ("{max_steps: 8, batch_size: 4, grad_accum: 1, logging_steps: 2, save_steps: 4, max_seq_len: 256, "
             "learning_rate: 5.0e-3}")


@pytest.fixture(scope="session")
def embedded_dir() -> Path:
    from dragon_dagster.engine import models

    return models.embedded_model_dir()


@pytest.fixture(scope="session")
def tiny_model(embedded_dir, tmp_path_factory) -> Path:
    from dragon_dagster.engine import models

    return models.build_tiny_model(tmp_path_factory.mktemp("models") / "tiny", tokenizer_from=str(embedded_dir))


def write_pipeline(directory: Path, model: Path, name: str = "tiny", args: str = TINY_ARGS,
                   prompt: str = "{subject}\\n\\n{body}", data: str = "example:tickets.csv") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: {name}
        model: {model}
        datasets:
          tickets: {{path: "{data}"}}
        stages:
          - {{name: sft_dataset, kind: chat_dataset, source: tickets, prompt: "{prompt}", response: reply}}
          - {{name: sft_adapter, kind: sft, dataset: sft_dataset, args: {args}, n_samples: 2, max_new_tokens: 8}}
          - {{name: merged_model, kind: merge}}
          - {{name: evaluation_report, kind: evaluate, dataset: sft_dataset, max_new_tokens: 8, n_samples: 2}}
        """))
    return path


@pytest.fixture()
def resources_for():
    from dragon_dagster.resources import ArtifactStore, MLflowTracking, TrainingResource

    def make(runs_dir: Path) -> dict:
        return {"store": ArtifactStore(runs_dir=str(runs_dir)), "tracking": MLflowTracking(runs_dir=str(runs_dir)),
                "training": TrainingResource(device="cpu")}
    return make


@pytest.fixture(scope="session")
def materialized(tiny_model, tmp_path_factory):
    """The whole tiny chain, materialized once on a persistent temp Dagster instance."""
    from dagster import DagsterInstance

    from dragon_dagster.assets.launch import materialize_pipeline
    from dragon_dagster.resources import ArtifactStore, MLflowTracking, TrainingResource

    root = tmp_path_factory.mktemp("chain")
    pipelines = root / "pipelines"
    write_pipeline(pipelines, tiny_model)
    runs = root / "runs"
    resources = {"store": ArtifactStore(runs_dir=str(runs)), "tracking": MLflowTracking(runs_dir=str(runs)),
                 "training": TrainingResource(device="cpu")}
    (root / "dagster_home").mkdir()
    instance = DagsterInstance.local_temp(str(root / "dagster_home"))
    outcome = materialize_pipeline("tiny", dirs=[pipelines], resources=resources, instance=instance)
    return {"outcome": outcome, "runs": runs, "instance": instance, "tracking": resources["tracking"],
            "pipelines": pipelines}
