"""What an orpo stage reports: its held-out preference figures."""

from __future__ import annotations

from ...train.preference import PreferenceResult


class ORPOResult(PreferenceResult):
    pass
