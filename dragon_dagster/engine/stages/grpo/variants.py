"""The grpo kind's loss variants: TRL GRPOConfig's loss settings, typed, described and checked together.

GRPO extends GRPOVariants (settings.py); each field reaches GRPOConfig by its name (trl_config.py). Every default is
TRL 1.16's, so a stage that sets none of them trains as TRL would. A combination that TRL would run but that
cannot do what the setting says (a clip bound below the other, a parameter of a loss the stage does not use) is
refused here, when the pipeline loads, naming the stage.

Each variant changes only what TRL's _compute_loss does with the per-token log-probabilities and entropies (and,
for scale_rewards and mask_truncated_completions, the advantages and the completion mask it is given), so every
one runs on this project's fast paths: the chunked head and unpad give the same log-probabilities and entropies,
and grouped sampling's recorded log-probabilities stand in for the old policy's exactly when TRL would compute
them (num_iterations > 1 included). tests/engine/stages/test_grpo_variants.py compares each with TRL's own path.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from ...train.reinforce.settings import ReinforceStage

GRPOLoss = Literal["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"]
CLIPPED: tuple[str, ...] = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")  # PPO's clip of the ratio
USED_BY: dict[str, tuple[str, ...]] = {  # a parameter and the loss types that read it
    "epsilon": (*CLIPPED, "cispo"),  # cispo's cap is epsilon_high, epsilon when that is unset
    "epsilon_high": (*CLIPPED, "cispo"),
    "delta": CLIPPED,
    "sapo_temperature_pos": ("sapo",),
    "sapo_temperature_neg": ("sapo",),
    "vespo_k_pos": ("vespo",),
    "vespo_lambda_pos": ("vespo",),
    "vespo_k_neg": ("vespo",),
    "vespo_lambda_neg": ("vespo",),
}


class GRPOVariants(ReinforceStage):
    """TRL's GRPO loss variants (GRPOConfig), with TRL's defaults."""

    loss_type: GRPOLoss = Field(
        "dapo",
        description="The loss, and how its token terms are averaged. dapo (TRL's default): over every completion "
        "token of the generation batch, no length bias; bnpo: over the tokens of each step's batch; grpo: per "
        "completion, then over completions (the original GRPO; it favours short right answers and long wrong "
        "ones); dr_grpo: over rows x max_new_tokens (Dr. GRPO, no length bias); cispo: clips the importance weight "
        "itself at epsilon_high and keeps every token's gradient (MiniMax-M1); sapo: a smooth gate instead of the "
        "clip (sapo_temperature_*); luspo: GSPO with each completion's loss scaled by its length (needs "
        "importance_sampling_level: sequence); vespo: a smooth Gamma weight of the completion's ratio instead of "
        "the clip (vespo_*).",
    )
    importance_sampling_level: Literal["token", "sequence"] = Field(
        "token",
        description="token: one importance ratio per token (GRPO). sequence: one per completion, the geometric mean "
        "of its tokens' ratios (GSPO, often steadier, for sequence-level rewards); GSPO as published pairs it with "
        "loss_type grpo (dapo, bnpo, dr_grpo and cispo then weigh each completion by its length, and TRL warns).",
    )
    epsilon: float = Field(
        0.2,
        gt=0,
        lt=1,
        description="Clip range: the importance ratio is clipped to [1 - epsilon, 1 + epsilon_high] (loss types "
        "grpo, bnpo, dr_grpo, dapo, luspo). Smaller keeps each update closer to the policy that sampled; it "
        "matters when samples serve several steps (num_iterations, speed.generation_batch_size).",
    )
    epsilon_high: float | None = Field(
        None,
        gt=0,
        description="Upper clip bound (clip-higher, DAPO uses 0.28 with epsilon 0.2): lets unlikely tokens with a "
        "positive advantage grow further, which keeps exploration up. null: epsilon. With loss_type cispo it is "
        "the cap on the importance weight instead (ScaleRL uses 5.0).",
    )
    delta: float | None = Field(
        None,
        gt=1,
        description="Two-sided clipping (INTELLECT-2): also caps the ratio at delta for tokens with a negative "
        "advantage, which the clip leaves unbounded; a value above 1 + epsilon_high, e.g. 4. null: off. Loss types "
        "grpo, bnpo, dr_grpo, dapo, luspo.",
    )
    scale_rewards: Literal["group", "batch", "none"] = Field(
        "group",
        description="How an advantage (a reward minus its group's mean) is scaled. group: by the group's standard "
        "deviation (GRPO); batch: by the generation batch's (PPO Lite: a group whose rewards barely differ is not "
        "blown up); none: not at all (Dr. GRPO: no bias towards prompts that are too easy or too hard).",
    )
    mask_truncated_completions: bool = Field(
        False,
        description="Leave completions cut off at max_new_tokens out of the loss (DAPO): an unfinished answer's "
        "reward says little about its tokens. If most are cut off (completions_not_truncated), little is left to "
        "learn from: raise max_new_tokens first.",
    )
    num_iterations: int = Field(
        1,
        ge=1,
        description="Optimizer steps on each generation batch (μ in the GRPO paper). Above 1 sampling is shared by "
        "more steps, and the later ones are off-policy, so the clip (epsilon) and the importance ratio come into "
        "play; TRL's default 1 is on-policy.",
    )
    top_entropy_quantile: float = Field(
        1.0,
        ge=0,
        le=1,
        description="Train only on this top share of completion tokens by entropy, the forks where the model "
        "hesitates (Beyond the 80/20 Rule: 0.2); 1.0 keeps every token, 0.0 only the most uncertain. The KL term "
        "still covers every token.",
    )
    sapo_temperature_pos: float = Field(
        1.0,
        gt=0,
        allow_inf_nan=False,
        description="sapo: the gate's temperature for tokens with a positive advantage; higher shuts it faster as "
        "the ratio leaves 1.",
    )
    sapo_temperature_neg: float = Field(
        1.05,
        gt=0,
        allow_inf_nan=False,
        description="sapo: the gate's temperature for tokens with a zero or negative advantage.",
    )
    vespo_k_pos: float = Field(
        2.0,
        ge=0,
        allow_inf_nan=False,
        description="vespo, positive advantages: the power k of the weight e^λ w^k e^(-λw) of a completion's "
        "ratio w; higher weighs down completions the policy has made less likely (w < 1) more.",
    )
    vespo_lambda_pos: float = Field(
        3.0,
        gt=0,
        allow_inf_nan=False,
        description="vespo, positive advantages: the decay λ; higher weighs down completions the policy has made "
        "likelier (w > 1) more.",
    )
    vespo_k_neg: float = Field(3.0, ge=0, allow_inf_nan=False, description="vespo, negative advantages: the power k.")
    vespo_lambda_neg: float = Field(
        2.0, gt=0, allow_inf_nan=False, description="vespo, negative advantages: the decay λ."
    )

    @model_validator(mode="after")
    def _variant_fits(self):
        where, loss = f"grpo stage {self.name!r}", self.loss_type
        unused = [
            name
            for name, losses in USED_BY.items()
            if loss not in losses and getattr(self, name) != type(self).model_fields[name].default
        ]
        if unused:
            users = sorted({u for name in unused for u in USED_BY[name]})
            raise ValueError(
                f"{where}: {', '.join(unused)} {'has' if len(unused) == 1 else 'have'} no effect with loss_type "
                f"{loss} (read by {', '.join(users)} only): remove {'it' if len(unused) == 1 else 'them'} or "
                "change loss_type"
            )
        high = self.epsilon if self.epsilon_high is None else self.epsilon_high
        if loss == "cispo" and high < 1:
            raise ValueError(
                f"{where}: loss_type cispo caps the importance weight at epsilon_high ({high}"
                f"{', from epsilon' if self.epsilon_high is None else ''}); a cap below 1 shrinks every token's "
                "weight, on-policy ones included: set epsilon_high >= 1 (ScaleRL uses 5.0)"
            )
        if loss in CLIPPED and high < self.epsilon:
            raise ValueError(
                f"{where}: epsilon_high ({high}) is below epsilon ({self.epsilon}): clip-higher widens the upper "
                "bound, so epsilon_high must be at least epsilon (DAPO: 0.28 with 0.2), or null for epsilon"
            )
        if self.delta is not None and self.delta <= 1 + high:
            raise ValueError(
                f"{where}: delta ({self.delta}) must be above 1 + epsilon_high ({1 + high:g}): it bounds the ratios "
                "the clip leaves open (tokens with a negative advantage), and below the clip it would cut ratios the "
                "clip keeps"
            )
        if loss == "luspo" and self.importance_sampling_level != "sequence":
            raise ValueError(
                f"{where}: loss_type luspo is GSPO's loss scaled by length and needs importance_sampling_level: "
                "sequence"
            )
        if loss == "vespo" and self.importance_sampling_level != "token":
            raise ValueError(
                f"{where}: loss_type vespo forms its sequence-level weight itself from the token ratios; "
                "importance_sampling_level: sequence would only change its KL term: leave it at token"
            )
        return self
