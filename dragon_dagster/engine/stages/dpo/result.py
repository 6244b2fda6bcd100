"""What a dpo stage reports: its held-out preference figures."""

from __future__ import annotations

from ...train.preference import PreferenceResult


class DPOResult(PreferenceResult):
    pass
