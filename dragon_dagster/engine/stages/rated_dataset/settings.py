"""The rated_dataset kind's settings: single replies labelled liked or disliked."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from ...data import row_mapping
from ...data.stage import DatasetStage


class RatedDataset(DatasetStage):
    """Single replies labelled liked or disliked, without a pair (for KTO): a prompt, a reply and a label."""

    makes: ClassVar[str] = "rated"

    kind: Literal["rated_dataset"]
    prompt: str = Field(description="The user turn: a column or a template.")
    reply: str = Field(description="The rated reply: a column or a template.")
    label: str = Field(
        description="The column saying whether the reply is liked: true/false, 1/0, yes/no, "
        "up/down, good/bad, liked/disliked or desirable/undesirable."
    )

    def map(self, df) -> tuple[list[dict], dict[str, int], list[int]]:
        kept: list[int] = []
        mapping = row_mapping.RatedMapping(self.prompt, self.reply, self.label, self.system)
        rows, dropped = row_mapping.map_rated(df, mapping, kept)
        return rows, dropped, kept
