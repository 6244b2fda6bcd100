"""The evaluate kind's settings: what the report measures, on how many held-out rows, with which judge."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ...config.settings import Backend
from ...config.stage import METRICS_DOC, MetricNames, Stage


class Evaluate(Stage):
    """Base model against the merged model on the same held-out rows: loss, metrics, samples, judge."""

    kind: Literal["evaluate"]
    dataset: str = Field(description="The dataset whose held-out rows are measured.")
    n_samples: int = Field(5, ge=0, description="Sample replies shown side by side.")
    max_eval_rows: int = Field(50, gt=0, description="Held-out rows measured (at most).")
    max_new_tokens: int = Field(128, gt=0, description="Length limit of generated replies.")
    n_judge: int = Field(5, ge=0, description="Held-out prompts judged pairwise, both orders (0: none).")
    judge: Backend | None = Field(
        None,
        description="The pairwise judge: a model or a server {url, model}; default: the base model (weak, offline).",
    )
    metrics: MetricNames = Field(None, description=METRICS_DOC)

    def reads(self) -> list[str]:
        return [self.dataset]
