"""The rloo kind's settings: what every reinforcement kind has (train/reinforce/settings.py) and RLOOConfig's own
arguments, with TRL's defaults.

RLOO's advantage of a completion is its reward minus the mean of the other completions of its group (the
leave-one-out baseline), not divided by the group's spread as GRPO's is: a group whose rewards barely differ
gives small advantages rather than blown-up ones. Its KL to the starting model goes into the reward (as in the
RLOO paper), where GRPO adds it to the loss.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from ...train.reinforce.settings import ReinforceStage


class RLOO(ReinforceStage):
    """REINFORCE leave-one-out on the stage's rewards: TRL's RLOOTrainer (dragon_reinforce's rloo method)."""

    kind: Literal["rloo"]
    beta: float = Field(
        0.05,
        ge=0,
        le=10,
        description="KL coefficient, 0..10: the KL to the starting model is taken off each completion's reward "
        "(TRL's default 0.05; 0 loads no reference pass).",
    )
    normalize_advantages: bool = Field(
        False, description="Scale the advantages of each generation batch to mean 0 and standard deviation 1."
    )
    reward_clip_range: tuple[float, float] | None = Field(
        None,
        description="Clip each completion's total reward to [low, high] before the baseline is taken, e.g. "
        "[-1, 1] for a reward model whose scores stray. null: no clipping.",
    )
    epsilon: float = Field(
        0.2,
        gt=0,
        lt=1,
        description="Clip range of the importance ratio, [1 - epsilon, 1 + epsilon_high]: it acts when samples serve "
        "several steps (num_iterations, speed.generation_batch_size).",
    )
    epsilon_high: float | None = Field(None, gt=0, description="Upper clip bound; null: epsilon.")
    num_iterations: int = Field(1, ge=1, description="Optimizer steps on each generation batch (TRL's μ).")
    mask_truncated_completions: bool = Field(
        False, description="Leave completions cut off at max_new_tokens out of the loss."
    )

    @model_validator(mode="after")
    def _ranges(self):
        where = f"rloo stage {self.name!r}"
        if self.epsilon_high is not None and self.epsilon_high < self.epsilon:
            raise ValueError(
                f"{where}: epsilon_high ({self.epsilon_high}) is below epsilon ({self.epsilon}): set it at least "
                "epsilon, or null for epsilon"
            )
        if self.reward_clip_range is not None and self.reward_clip_range[0] >= self.reward_clip_range[1]:
            raise ValueError(
                f"{where}: reward_clip_range {list(self.reward_clip_range)} must be [low, high] with low < high"
            )
        return self
