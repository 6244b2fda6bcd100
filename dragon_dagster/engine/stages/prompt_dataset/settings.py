"""The prompt_dataset kind's settings: prompts to practise on with rewards, and their reference answers."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from ...data import row_mapping
from ...data.stage import DatasetStage


class PromptDataset(DatasetStage):
    """Prompts to practise on with rewards (dragon_map_prompts); every other column reaches the rewards."""

    makes: ClassVar[str] = "prompts"

    kind: Literal["prompt_dataset"]
    prompt: str = Field(description="The user turn: a column or a template.")
    reference: str | None = Field(None, description="The checkable answer rewards compare with.")

    answers_are_text: ClassVar[bool] = False  # a reference (a number, a label) repeats across prompts by nature

    def map(self, df) -> tuple[list[dict], dict[str, int], list[int]]:
        rows = row_mapping.map_prompts(df, row_mapping.PromptsMapping(self.prompt, self.reference, self.system))
        return rows, {}, list(range(len(rows)))
