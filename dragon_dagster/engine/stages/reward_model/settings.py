"""The reward_model kind's settings: a Bradley-Terry reward model (TRL's RewardTrainer) on preference pairs."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from ...config.stage import Continues
from ...train.preference import PreferenceArgs, PreferenceLora, check_trains_on, refuse_lora_dropout
from ...train.stage import TrainerStage


class RewardModelArgs(PreferenceArgs):
    """A reward head learns faster than a policy moves: a higher learning rate than DPO's, one pass by default."""

    epochs: float = Field(1, gt=0, description="Passes over the training pairs.")
    learning_rate: float = Field(2e-4, gt=0, allow_inf_nan=False, description="Peak learning rate of the adapter.")


class RewardModel(TrainerStage):
    """A learned reward (TRL's RewardTrainer): the base model with a LoRA adapter and a scalar head, trained so that
    the chosen reply of each pair scores above the rejected one. Its scores rank any reply, so a GRPO stage can
    optimize fresh samples against it (`{type: reward_model, stage: <this stage>}`) and the promotion gate can
    score replies nobody rated.

    It starts from the pipeline's base model and stays out of the adapter chain: the stages after it continue from
    the policy before it, and a merge never folds it in."""

    continues: ClassVar[Continues] = "never"
    in_chain: ClassVar[bool] = False
    scores_replies: ClassVar[bool] = True
    trains_on: ClassVar[tuple[str, ...]] = ("pairs",)
    trl_config: ClassVar[str] = "trl.RewardConfig"

    kind: Literal["reward_model"]
    center_rewards: float | None = Field(
        0.01,
        ge=0,
        allow_inf_nan=False,
        description="TRL's center_rewards_coefficient: a penalty on the mean squared score that keeps scores near 0, "
        "so a reward model's scale stays comparable across runs (0.01 as in the paper that proposed it; null: off).",
    )
    min_accuracy: float = Field(
        0.6,
        ge=0,
        le=1,
        description="The held_out_accuracy check warns when fewer held-out pairs than this are ranked right "
        "(0.5 is a coin).",
    )
    lora: PreferenceLora = Field(
        default_factory=PreferenceLora, description="The adapter's shape (dragon_lora); dropout stays 0."
    )
    args: RewardModelArgs = Field(default_factory=RewardModelArgs, description="Trainer arguments.")

    def base_changing_init_problem(self) -> str | None:
        return (
            "PEFT's conversion of such an adapter at save keeps only the LoRA matrices, and would drop the trained "
            "score head (modules_to_save)"
        )

    @model_validator(mode="after")
    def _no_lora_dropout(self):
        refuse_lora_dropout(self)
        return self

    def check_inputs(self, pipeline) -> None:
        check_trains_on(self, pipeline)
