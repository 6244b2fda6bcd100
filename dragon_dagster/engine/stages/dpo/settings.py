"""The dpo kind's settings: Direct Preference Optimization on pairs (TRL's DPOTrainer)."""

from __future__ import annotations

from typing import ClassVar, Literal

from ...train.preference import PreferenceStage


class DPO(PreferenceStage):
    """Direct Preference Optimization on pairs (dragon_prefer, method dpo): the chosen reply made likelier than the
    rejected one, relative to the model the stage started from (with LoRA, that model is the adapter switched off:
    no reference copy is loaded)."""

    trl_config: ClassVar[str] = "trl.DPOConfig"
    kind: Literal["dpo"]
