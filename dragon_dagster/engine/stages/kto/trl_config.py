"""The kto kind's settings as TRL's KTOConfig, its loss weights balanced by the labels of the rows it trains on
unless the stage sets them (train/trl_config.py)."""

from __future__ import annotations

from ...train.preference import preference_config
from ...train.trl_config import TrainerRun
from .settings import KTO


def to_trl_config(settings: KTO, run: TrainerRun, labels: list[bool] | None = None):
    """labels: each training reply liked or not (the weights balance them); None: the weights as the stage has
    them (TRL's 1.0 where unset)."""
    from trl import KTOConfig

    weights = kto_weights(settings, labels) if labels is not None else {}
    return preference_config(KTOConfig, settings, run, **weights)


def kto_weights(settings: KTO, labels: list[bool]) -> dict[str, float]:
    """KTO's loss weights: the stage's, else balanced so that liked x weight ~ disliked x weight (the KTO paper
    asks for a ratio in [1, 4/3]); ratings are rarely balanced (people click thumbs up more often)."""
    liked, disliked = sum(labels), len(labels) - sum(labels)
    desirable = settings.desirable_weight or (min(1.0, disliked / liked) if liked and disliked else 1.0)
    undesirable = settings.undesirable_weight or (min(1.0, liked / disliked) if liked and disliked else 1.0)
    return {"desirable_weight": desirable, "undesirable_weight": undesirable}
