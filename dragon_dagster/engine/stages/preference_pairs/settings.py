"""The preference_pairs kind's settings: pairs made from the latest adapter's own samples."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from ...config.settings import Backend
from ...config.stage import Continues, Stage


class PreferencePairs(Stage):
    """Pairs made from the latest adapter's own samples (dragon_synthesize_pairs)."""

    continues: ClassVar[Continues] = "required"  # the student: the latest adapter before this stage
    makes: ClassVar[str] = "pairs"

    kind: Literal["preference_pairs"]
    dataset: str = Field(description="An earlier chat dataset whose prompts (and replies) are used.")
    mode: Literal["teacher", "judge"] = Field(
        "teacher",
        description="teacher: the teacher's reply is chosen, the student's rejected. judge: the "
        "student's best and worst samples by a judge's score.",
    )
    teacher: Backend = Field(
        "reference", description="'reference' (the dataset's own reply), a model, or a server {url, model}."
    )
    judge: Backend | None = Field(
        None, description="Judge mode: the scoring model (default: the base model; weak, use a server)."
    )
    rubric: str | None = Field(None, description="What the judge scores for.")
    n: int = Field(100, ge=1, description="Prompts to make pairs from.")
    n_samples_per_prompt: int = Field(4, ge=1, description="Judge mode: student samples per prompt (>= 2).")
    min_gap: float = Field(2.0, ge=0, description="Judge mode: least score gap between chosen and rejected.")
    temperature: float = Field(0.8, gt=0, le=3, description="Student sampling temperature, in (0, 3].")
    max_new_tokens: int = Field(256, gt=0, description="Length limit of sampled replies.")
    eval_frac: float = Field(
        0.05,
        ge=0,
        lt=1,
        description="Share of the n pairs held out. They are made from the source dataset's held-out rows (the "
        "training rows were trained on by the stages before this one), none under 20 pairs; a source without "
        "held-out rows has its pairs split instead.",
    )
    seed: int = Field(42, description="Seed of the prompt order and the split.")

    @model_validator(mode="after")
    def _judge_needs_samples(self):
        if self.mode == "judge" and self.n_samples_per_prompt < 2:
            raise ValueError("judge mode needs n_samples_per_prompt >= 2 to have a best and a worst sample")
        return self

    def reads(self) -> list[str]:
        return [self.dataset]
