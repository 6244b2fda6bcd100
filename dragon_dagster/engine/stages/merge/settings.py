"""The merge kind's settings: the adapter chain folded into the base model."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ...config.stage import Stage


class Merge(Stage):
    """The adapter chain folded into the base model: a standalone directory plain transformers loads."""

    kind: Literal["merge"]
    sample_prompt: str = Field(
        "Hello! What can you help me with?", description="A prompt whose reply is shown in the asset's metadata."
    )
