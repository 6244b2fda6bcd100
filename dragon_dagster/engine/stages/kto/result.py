"""What a kto stage reports: held-out accuracy and implicit-reward margin per reply, and its loss weights."""

from __future__ import annotations

from ...train.preference import PreferenceResult


class KTOResult(PreferenceResult):
    eval_rows: int = 0
    train_liked: int = 0
    train_disliked: int = 0
    desirable_weight: float = 1.0
    undesirable_weight: float = 1.0
    reward_liked: float | None = None
    reward_disliked: float | None = None
    eval_liked: int | None = None
    eval_disliked: int | None = None
    kl: float | None = None
