"""The synthetic_dataset kind's settings: SFT rows a teacher writes for a dataset's prompts, with a quality pass."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from ...config.settings import Backend
from ...config.stage import Stage


class SyntheticDataset(Stage):
    """Teacher-written SFT rows with a quality pass (dragon_synthesize)."""

    makes: ClassVar[str] = "chat"

    kind: Literal["synthetic_dataset"]
    dataset: str = Field(description="An earlier dataset whose prompts the teacher answers.")
    teacher: Backend = Field(description="The teacher: a model name or directory, or a server {url, model}.")
    system: str | None = Field(None, description="System prompt given to the teacher.")
    max_new_tokens: int = Field(512, gt=0, description="Length limit of teacher replies.")
    temperature: float = Field(0.7, ge=0, le=3, description="Teacher sampling temperature.")
    judge: Backend | None = Field(None, description="Optional judge gate: a model or server scoring each reply.")
    min_score: float = Field(7.0, ge=0, le=10, description="Judge gate: keep rows scored at least this (1-10).")
    rubric: str | None = Field(None, description="What the judge scores for.")
    dedupe: bool = Field(True, description="Drop exact and near-duplicate replies.")
    near_dup_threshold: float = Field(
        0.92, gt=0, le=1, description="Similarity above which replies are near-duplicates."
    )
    min_chars: int = Field(1, ge=0, description="Drop replies shorter than this.")
    max_chars: int | None = Field(None, gt=0, description="Drop replies longer than this.")
    min_alpha_ratio: float = Field(0.0, ge=0, le=1, description="Drop replies with a smaller share of letters.")
    eval_frac: float = Field(0.05, ge=0, lt=1, description="Share of rows held out.")
    seed: int = Field(42, description="Seed of the split.")

    def reads(self) -> list[str]:
        return [self.dataset]
