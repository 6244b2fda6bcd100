"""The sft kind's settings as TRL's SFTConfig (train/trl_config.py: fields TRL names alike pass as they are)."""

from __future__ import annotations

from ...train.trl_config import TrainerRun, trl_config
from . import turns
from .settings import SFT

NAMES = {"args.max_seq_len": "max_length"}  # our names TRL spells otherwise


def to_trl_config(settings: SFT, run: TrainerRun):
    from trl import SFTConfig

    return trl_config(
        SFTConfig,
        settings,
        run,
        NAMES,
        **turns.loss_args(settings.train_on),
        packing=bool(run.speed and run.speed.packing == "on"),
        packing_strategy="bfd",
    )
