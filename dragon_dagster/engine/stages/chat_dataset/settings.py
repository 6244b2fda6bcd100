"""The chat_dataset kind's settings: prompt and reply columns (or templates), or conversations in the layouts
people have them in (OpenAI messages, ShareGPT, Alpaca), declared or detected."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from ...data import conversations, errors, row_mapping
from ...data.stage import DatasetStage


class ChatDataset(DatasetStage):
    """Chat rows for SFT (dragon_map): prompt/response columns or `{column}` templates, or whole conversations."""

    kind: Literal["chat_dataset"]
    layout: Literal["auto", "columns", "messages", "sharegpt", "alpaca"] = Field(
        "auto",
        description="How the table holds its conversations. columns: prompt and response (columns or templates); "
        "messages: OpenAI-style role/content turns (tool_calls and tool turns included); sharegpt: from/value "
        "turns (human, gpt, system, function_call, observation, ...); alpaca: instruction, optional input and "
        "output columns. auto: columns when prompt and response are set, else a 'messages' or 'conversations' "
        "column (its turns tell messages from sharegpt), else instruction and output columns. A `tools` column "
        "(JSON schemas) goes along with messages and sharegpt rows.",
    )
    prompt: str | None = Field(None, description="The user turn: a column or a template like '{subject}\\n\\n{body}'.")
    response: str | None = Field(None, description="The assistant reply: a column or a template.")
    conversations: str | None = Field(
        None,
        description="The column of whole conversations (messages or sharegpt layout); default: the column named "
        "'messages' or 'conversations'. The last assistant turn is the reply trained on (sft's train_on "
        "all_assistant_turns trains the earlier ones too).",
    )

    @model_validator(mode="after")
    def _mapping(self):
        try:
            self.mapping().validate()
        except errors.DataError as exc:
            raise ValueError(f"chat_dataset {self.name!r}: {exc}") from None
        return self

    def mapping(self) -> row_mapping.Mapping:
        return row_mapping.Mapping(self.prompt, self.response, self.system, self.conversations, self.layout)

    def map(self, df) -> tuple[list[dict], dict[str, int], list[int]]:
        rows = row_mapping.map_rows(df, self.mapping())
        return rows, {}, list(range(len(rows)))

    def layout_problems(self, columns: list[str]) -> list[str]:
        """Whether the header's columns fit the layout (detected or declared), before any training."""
        if self.conversations and self.conversations not in columns:
            return []  # the check of every named column reports it
        try:
            conversations.choose_layout(columns, self.layout, bool(self.prompt and self.response), self.conversations)
        except errors.DataError as exc:
            return [f"{self.name}: {exc}"]
        return []
