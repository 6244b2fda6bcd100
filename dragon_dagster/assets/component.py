"""The pipeline as a Dagster Component: `defs/<name>/defs.yaml` with `type: dragon_dagster.PostTrainingPipeline`
and the pipeline under `attributes:`, validated by `dg check yaml` against the stage models' JSON schema,
listed by `dg list defs`, and scaffolded with a starter pipeline by `dg scaffold defs`.

A broken pipeline does not take the code location down: Dagster only checks that the attributes are a
mapping, the component validates them itself (file, line and field named) and, when they are wrong, adds
a sensor whose description and every tick say what is wrong, while the other pipelines load as usual.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import BaseModel, ConfigDict

from ..engine.pipeline import Pipeline, PipelineError, load
from .factory import build_pipeline_defs

log = logging.getLogger("dragon_dagster")


class PipelineAttributes(BaseModel):
    """What Dagster checks before the component loads: a mapping. Editors and `dg check yaml` get the full
    schema of a Pipeline; the Pipeline model itself validates when the component loads."""

    model_config = ConfigDict(extra="allow")

    @classmethod
    def model_json_schema(cls, *args, **kwargs) -> dict[str, Any]:
        return Pipeline.model_json_schema(*args, **kwargs)


STARTER = """\
  # A starter pipeline: SFT on the bundled support tickets, merged and evaluated on held-out rows.
  # Point `path` at your own CSV/JSONL/Parquet file and map its columns with {{column}} templates.
  # Every stage kind, setting and default: docs/reference/stages.md (`make docs`) and `dg utils inspect-component`.
  name: {name}
  model: smollm2-135m
  datasets:
    tickets:
      path: example:tickets.csv
  stages:
    - name: sft_dataset
      kind: chat_dataset
      source: tickets
      prompt: "{{subject}}\\n\\n{{body}}"
      response: reply
      group_by: subject                # tickets on one subject stay on one side of the held-out split
      eval_frac: 0.05
    - name: sft_adapter
      kind: sft
      dataset: sft_dataset
      lora: {{r: 16, alpha: 32}}
      args: {{epochs: 1, learning_rate: 2.0e-4, batch_size: 4, grad_accum: 1, max_seq_len: 512}}
    - name: merged_model
      kind: merge
    - name: evaluation_report
      kind: evaluate
      dataset: sft_dataset
  profiles:
    quick:
      sft_adapter: {{args: {{max_steps: 20, logging_steps: 2}}, n_samples: 3}}
      evaluation_report: {{n_samples: 3, n_judge: 2, max_new_tokens: 48}}
"""


class PipelineScaffolder(dg.Scaffolder):
    """Writes a defs.yaml with a small runnable pipeline named after its folder."""

    def scaffold(self, request: dg.ScaffoldRequest) -> None:
        name = re.sub(r"[^a-z0-9_]", "_", request.target_path.name.lower()).lstrip("_0123456789") or "pipeline"
        request.target_path.mkdir(parents=True, exist_ok=True)
        (request.target_path / "defs.yaml").write_text(
            f"type: {request.type_name}\n\nattributes:\n{STARTER.format(name=name)}"
        )


@dg.scaffold_with(PipelineScaffolder)
class PostTrainingPipeline(dg.Component):
    """Post-train a small language model with LoRA: datasets, SFT/DPO/ORPO/GRPO adapters, a merged model and an
    evaluation report as assets, tracked in MLflow."""

    def __init__(self, pipeline: Pipeline | None, error: str | None = None, folder: str = ""):
        self.pipeline, self.error, self.folder = pipeline, error, folder

    @classmethod
    def get_model_cls(cls) -> type[BaseModel]:
        return PipelineAttributes

    @classmethod
    def load(cls, attributes: BaseModel | None, context: dg.ComponentLoadContext) -> PostTrainingPipeline:
        source = Path(context.path) / "defs.yaml"
        try:  # our own loader: the same models, with the YAML's line numbers in the message
            return cls(load(source))
        except PipelineError as exc:
            return cls(None, str(exc), Path(context.path).name)

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        if self.pipeline is not None:
            return dg.Definitions(**build_pipeline_defs(self.pipeline))
        log.warning("pipeline not loaded: %s", self.error)
        return dg.Definitions(sensors=[broken_pipeline_sensor(self.folder, self.error)])


def broken_pipeline_sensor(folder: str, error: str) -> dg.SensorDefinition:
    """Where a broken pipeline shows in the UI (Automation): its name says which, its description and ticks why."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", folder) + "_pipeline_is_broken"

    @dg.sensor(
        name=name,
        description=f"This pipeline did not load: {error}",
        minimum_interval_seconds=3600,
        default_status=dg.DefaultSensorStatus.RUNNING,
    )
    def _broken(context):
        return dg.SkipReason(f"the pipeline did not load: {error}")

    return _broken
