"""What a reward_model stage reports: how well it ranks held-out pairs, and where its scores sit."""

from __future__ import annotations

from typing import Any

from ...config.results import TrainingResult, fig


class RewardModelResult(TrainingResult):
    eval_pairs: int = 0
    train_pairs: int = 0
    accuracy: float | None = None  # share of held-out pairs whose chosen reply scores above the rejected one
    margin: float | None = None  # mean score(chosen) - score(rejected) on them
    chosen_mean: float | None = None
    rejected_mean: float | None = None
    score_mean: float | None = None  # over every held-out reply: the centre GRPO's sigmoid scale reads around
    score_std: float | None = None
    train_accuracy: float | None = None  # the last logged training accuracy (TRL's)

    def own_figures(self) -> dict[str, Any]:
        return {"rm_accuracy": self.accuracy, "rm_margin": self.margin}

    @classmethod
    def headline(cls, metrics: dict[str, float]) -> str:
        parts = [f"{name} {fig(metrics[f'eval/{name}'])}" for name in ("rm_accuracy", "rm_margin")]
        parts = [p for p, name in zip(parts, ("rm_accuracy", "rm_margin")) if f"eval/{name}" in metrics]
        if not parts and "train/loss" in metrics:
            parts.append(f"train loss {fig(metrics['train/loss'])}")
        return ", ".join(parts)
