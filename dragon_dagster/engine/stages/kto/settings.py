"""The kto kind's settings: Kahneman-Tversky Optimization on single liked or disliked replies."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from ...train.preference import PreferenceStage


class KTO(PreferenceStage):
    """Kahneman-Tversky Optimization (TRL's KTOTrainer) on rated replies, the ratings people give without a
    matching opposite (a rated dataset); pairs are split into a liked and a disliked reply."""

    trains_on: ClassVar[tuple[str, ...]] = ("rated", "pairs")

    trl_config: ClassVar[str] = "trl.KTOConfig"
    kind: Literal["kto"]
    desirable_weight: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="Weight of the liked replies' loss. Default: both weights balance the counts (the side "
        "with fewer replies weighs more, as the KTO paper advises).",
    )
    undesirable_weight: float | None = Field(
        None, gt=0, allow_inf_nan=False, description="Weight of the disliked replies' loss."
    )

    def base_changing_init_problem(self) -> str | None:
        return "KTO's reference model is the policy with its adapter off (no reference copy is loaded)"

    @model_validator(mode="after")
    def _batch_holds_others(self):
        if self.args.batch_size < 2:
            raise ValueError(
                f"stage {self.name!r}: KTO needs batch_size >= 2 (it estimates its KL term from the "
                "other replies in a batch)"
            )
        return self
