"""The dpo kind's settings: Direct Preference Optimization on pairs (TRL's DPOTrainer), and its loss types."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator

from ...train.preference import PreferenceStage

DPOLoss = Literal[
    "sigmoid",
    "hinge",
    "ipo",
    "exo_pair",
    "nca_pair",
    "robust",
    "bco_pair",
    "sppo_hard",
    "aot",
    "aot_unpaired",
    "apo_zero",
    "apo_down",
    "discopop",
    "sft",
    "sigmoid_norm",
]
SMOOTHED: tuple[str, ...] = ("robust", "exo_pair", "aot", "aot_unpaired")  # the loss types label_smoothing enters


def _one_or_list(schema: dict[str, Any]) -> None:
    """The JSON schema of loss_type: one loss type, or a list of them (the model wraps one in a list)."""
    items = schema.pop("items")
    schema.pop("type")
    schema["anyOf"] = [items, {"type": "array", "items": items, "minItems": 1}]


class DPO(PreferenceStage):
    """Direct Preference Optimization on pairs (dragon_prefer, method dpo): the chosen reply made likelier than the
    rejected one, relative to the model the stage started from (with LoRA, that model is the adapter switched off:
    no reference copy is loaded)."""

    trl_config: ClassVar[str] = "trl.DPOConfig"
    kind: Literal["dpo"]

    def base_changing_init_problem(self) -> str | None:
        return "DPO's reference model is the policy with its adapter off (no reference copy is loaded)"

    loss_type: Annotated[list[DPOLoss], BeforeValidator(lambda v: [v] if isinstance(v, str) else v)] = Field(
        default_factory=lambda: ["sigmoid"],
        json_schema_extra=_one_or_list,
        description="The preference loss (TRL's loss_type), or a list of them added up with loss_weights. sigmoid: "
        "DPO; sigmoid_norm: DPO on length-averaged log-ratios; ipo: IPO, a squared loss "
        "that stops at a margin instead of pushing it on (beta is its τ; less overfitting on near-deterministic "
        "preferences); hinge: SLiC's hinge; robust: for noisy labels, flipped with probability label_smoothing; "
        "exo_pair: EXO (label_smoothing > 0, 1e-3); nca_pair and bco_pair: each reply scored on its own, so the "
        "chosen one is pushed up in its own right; sppo_hard: SPPO with hard labels; aot and aot_unpaired: margins "
        "aligned across the batch by sorting; apo_zero: the chosen replies are better than the model's own (raise "
        "them), apo_down: worse (lower both); discopop: DiscoPOP (discopop_tau); sft: the chosen reply's NLL, to "
        "combine, e.g. [sigmoid, sft] (RPO) or [sigmoid, bco_pair, sft] with loss_weights [0.8, 0.2, 1.0] (MPO).",
    )
    loss_weights: list[Annotated[float, Field(gt=0, allow_inf_nan=False)]] | None = Field(
        None, description="One weight per loss_type, in the same order; null: 1.0 each."
    )
    label_smoothing: float = Field(
        0.0,
        ge=0,
        lt=0.5,
        description="robust: the probability that a pair's label is flipped (Robust DPO suggests 0.1); exo_pair: "
        "its ε (EXO suggests 1e-3, and it must be above 0); aot, aot_unpaired: conservative smoothing. Other loss "
        "types ignore it, so it is refused there.",
    )
    discopop_tau: float = Field(
        0.05,
        gt=0,
        allow_inf_nan=False,
        description="discopop: the temperature of its blend of the logistic and the exponential loss (the paper's "
        "0.05).",
    )

    @field_validator("loss_type", mode="after")
    @classmethod
    def _named_once(cls, losses: list[str]) -> list[str]:
        if not losses:
            raise ValueError("name at least one loss type, e.g. sigmoid")
        repeated = sorted({loss for loss in losses if losses.count(loss) > 1})
        if repeated:
            raise ValueError(f"{', '.join(repeated)} named twice: give it once, weighted by loss_weights")
        return losses

    @model_validator(mode="after")
    def _loss_parameters_fit(self):
        where, losses = f"dpo stage {self.name!r}", self.loss_type
        if self.loss_weights is not None and len(self.loss_weights) != len(losses):
            raise ValueError(
                f"{where}: {len(self.loss_weights)} loss_weights for {len(losses)} loss types {losses}: give one "
                "weight per loss type, in the same order"
            )
        if "exo_pair" in losses and self.label_smoothing == 0:
            raise ValueError(f"{where}: loss_type exo_pair needs label_smoothing above 0 (EXO suggests 1e-3)")
        if self.label_smoothing and not set(losses) & set(SMOOTHED):
            raise ValueError(
                f"{where}: label_smoothing has no effect with loss_type {losses} (read by {', '.join(SMOOTHED)} "
                "only): remove it or change loss_type"
            )
        if self.discopop_tau != type(self).model_fields["discopop_tau"].default and "discopop" not in losses:
            raise ValueError(
                f"{where}: discopop_tau has no effect with loss_type {losses} (read by discopop only): remove it "
                "or change loss_type"
            )
        return self
