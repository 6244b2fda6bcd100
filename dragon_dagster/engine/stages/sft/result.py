"""What an sft stage reports: held-out loss and perplexity, and task metrics of its sample replies."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from ...config.results import TrainingResult, finite


class SFTResult(TrainingResult):
    train_runtime_s: float | None = None
    eval_loss: float | None = None  # on every held-out row
    perplexity: float | None = None
    eval_tokens: int = 0
    metrics: dict[str, float] = Field(default_factory=dict)  # on the first n_samples rows (computed_on)
    computed_on: str = ""
    metrics_chosen_by: Literal["pipeline", "references"] = "references"

    def own_figures(self) -> dict[str, Any]:
        return {"eval_loss": self.eval_loss, "perplexity": self.perplexity}

    def metadata(self) -> dict[str, Any]:
        return {**super().metadata(), **{f"eval/{k}": v for k, v in finite(self.metrics).items()}}
