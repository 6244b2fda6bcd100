"""The chat_dataset kind's settings: prompt and reply columns (or templates), or a conversations column."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from ...data import tables
from ...data.stage import DatasetStage


class ChatDataset(DatasetStage):
    """Prompt and reply pairs for SFT (dragon_map): columns or `{column}` templates, or a conversations column."""

    kind: Literal["chat_dataset"]
    prompt: str | None = Field(None, description="The user turn: a column or a template like '{subject}\\n\\n{body}'.")
    response: str | None = Field(None, description="The assistant reply: a column or a template.")
    conversations: str | None = Field(
        None,
        description="A column of whole conversations (lists of role/content "
        "turns); the last assistant turn is trained on.",
    )

    @model_validator(mode="after")
    def _mapping(self):
        if self.conversations is None and not (self.prompt and self.response):
            raise ValueError(
                f"chat_dataset {self.name!r} needs prompt and response (columns or templates), or conversations"
            )
        return self

    def map(self, df) -> tuple[list[dict], dict[str, int], list[int]]:
        rows = tables.map_rows(df, tables.Mapping(self.prompt, self.response, self.system, self.conversations))
        return rows, {}, list(range(len(rows)))
