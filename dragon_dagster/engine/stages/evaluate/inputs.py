"""What the evaluate kind's worker reads: the two models, the held-out rows, the merged model's chain (each stage's
own figures, loss curve and rewards, from its adapter's manifest) and, for a retraining, its held-out feedback."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from ...config.job import Contract, JobPath, RewardModelInput, ToolsInput
from ...config.results import PassAtK
from ...rewards import RewardSpec


class ChainStage(Contract):
    """One adapter stage of the merged model's chain, as its manifest describes it."""

    name: str
    dir: JobPath  # its artifact directory (progress.jsonl for the loss curve; custom reward files)
    objective: str
    loss_label: str
    figures: dict[str, float] = Field(default_factory=dict)
    rewards: list[dict[str, Any]] = Field(default_factory=list)  # custom files relative to dir
    pass_at_k: list[PassAtK] = Field(default_factory=list)  # a sampling stage's, its model against its start
    temperature: float | None = None  # what a sampling stage sampled at (the report's pass@k samples at it)


class FeedbackInputs(Contract):
    """A retraining's report also measures the held-out feedback conversations (the promotion gate's figures)."""

    held_out: dict[str, JobPath]  # objective -> held-out rows (copied into the report's directory)
    taste: list[RewardSpec] | None = None  # rewards; custom files relative to the report's directory
    reward_models: list[RewardModelInput] = []  # the reward model a reward_model taste names (rlhf's)
    liked_at: float = 1.0
    objectives: list[dict[str, Any]] = Field(default_factory=list)  # what each objective trained on, or why not


class ReportInputs(Contract):
    base_model: JobPath
    merged_model: JobPath
    eval_file: JobPath
    train_file: JobPath | None = None
    chain: list[ChainStage] = Field(default_factory=list)
    first_stage_adapters: list[JobPath] = Field(default_factory=list)  # the model after the first stage (judge)
    feedback: FeedbackInputs | None = None
    max_len: int = 1024
    tools: ToolsInput | None = None  # the pipeline's tools: the report measures the models' calls with them
