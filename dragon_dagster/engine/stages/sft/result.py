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
    train_on: Literal["final_turn", "all_assistant_turns"] = "final_turn"
    rendering: Literal["native", "fallback", "none"] = Field(
        "none",
        description="How the chat template rendered the rows (tools/template.py): the model's own template for "
        "tools (native), the ChatML tool format with generation marks (fallback), or the model's own untouched.",
    )

    def own_figures(self) -> dict[str, Any]:
        return {"eval_loss": self.eval_loss, "perplexity": self.perplexity}

    def metadata(self) -> dict[str, Any]:
        return {
            **super().metadata(),
            **{f"eval/{k}": v for k, v in finite(self.metrics).items()},
            "train_on": self.train_on,
            "chat_template": self.rendering,
        }
