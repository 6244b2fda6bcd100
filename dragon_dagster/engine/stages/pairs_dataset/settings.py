"""The pairs_dataset kind's settings: a prompt, a chosen and a rejected reply."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from ...data import row_mapping
from ...data.stage import DatasetStage


class PairsDataset(DatasetStage):
    """Preference pairs (dragon_map_pairs): a prompt, a chosen and a rejected reply."""

    makes: ClassVar[str] = "pairs"

    kind: Literal["pairs_dataset"]
    prompt: str = Field(description="The user turn: a column or a template.")
    chosen: str = Field(description="The preferred reply: a column or a template.")
    rejected: str = Field(description="The worse reply: a column or a template.")

    def map(self, df) -> tuple[list[dict], dict[str, int], list[int]]:
        kept: list[int] = []
        mapping = row_mapping.PairsMapping(self.prompt, self.chosen, self.rejected, self.system)
        rows, dropped = row_mapping.map_pairs(df, mapping, kept)
        return rows, dropped, kept
