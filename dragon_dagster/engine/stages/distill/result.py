"""What a distill stage reports: on the held-out rows, the student before and after and the teacher, each one's
NLL of the reference replies and task metrics of its greedy replies, and the student's divergence from the
teacher over its own replies before and after."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from ...config.job import Contract
from ...config.results import TrainingResult, fig, finite


class ModelFigures(Contract):
    """One model's figures on the held-out rows."""

    nll: float | None = None  # mean per-token NLL of the held-out references (None: the rows have none)
    metrics: dict[str, float] = Field(default_factory=dict)  # task metrics of its greedy replies


class DistillResult(TrainingResult):
    teacher: str = Field(description="The teacher, as the stage names it (a registered model with its version).")
    beta: float
    temperature: float
    eval_rows: int = 0
    student_before: ModelFigures
    student_after: ModelFigures
    teacher_figures: ModelFigures
    divergence_before: float | None = None
    divergence_after: float | None = None

    def own_figures(self) -> dict[str, Any]:
        figures = {
            "eval_loss": self.student_after.nll,  # the chain's held-out NLL after this stage
            "eval_loss_before": self.student_before.nll,
            "teacher_eval_loss": self.teacher_figures.nll,
            "divergence_before": self.divergence_before,
            "divergence_after": self.divergence_after,
        }
        figures.update({f"metric_after/{k}": v for k, v in self.student_after.metrics.items()})
        figures.update({f"metric_before/{k}": v for k, v in self.student_before.metrics.items()})
        figures.update({f"teacher_metric/{k}": v for k, v in self.teacher_figures.metrics.items()})
        return finite(figures)

    def metadata(self) -> dict[str, Any]:
        return {**super().metadata(), "teacher": self.teacher, "beta": self.beta}

    @classmethod
    def headline(cls, metrics: dict[str, float]) -> str:
        """Held-out NLL before -> after (teacher's), divergence from the teacher before -> after."""
        parts = []
        if "eval/loss" in metrics:
            parts.append(
                f"NLL {fig(metrics.get('eval/loss_before'))} -> {fig(metrics['eval/loss'])} "
                f"(teacher {fig(metrics.get('eval/teacher_loss'))})"
            )
        if "eval/divergence" in metrics:
            parts.append(
                f"divergence {fig(metrics.get('eval/divergence_before'))} -> {fig(metrics['eval/divergence'])}"
            )
        if not parts and "train/loss" in metrics:
            parts.append(f"train loss {fig(metrics['train/loss'])}")
        return ", ".join(parts)
