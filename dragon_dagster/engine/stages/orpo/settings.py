"""The orpo kind's settings: Odds Ratio Preference Optimization on pairs (TRL's experimental ORPOTrainer)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from ...train.preference import PreferenceStage


class ORPO(PreferenceStage):
    """Odds Ratio Preference Optimization on pairs (dragon_prefer, method orpo): supervised loss on the chosen
    reply plus an odds-ratio term against the rejected one; needs no reference model at all."""

    trl_config: ClassVar[str] = "trl.experimental.orpo.ORPOConfig"
    kind: Literal["orpo"]
    beta: float = Field(0.1, gt=0, allow_inf_nan=False, description="Weight of the odds-ratio term (ORPO's lambda).")
