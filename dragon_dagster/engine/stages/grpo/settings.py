"""The grpo kind's settings: reinforcement learning with verifiable rewards (dragon_reinforce)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from ...config.training import TrainArgs
from ...rewards import RewardSpec, known_types
from .variants import GRPOVariants


class GRPOArgs(TrainArgs):
    """dragon_reinforce's defaults: one pass, no accumulation, frequent checkpoints (each step samples)."""

    epochs: float = Field(1, gt=0, description="Passes over the prompts.")
    learning_rate: float = Field(1e-5, gt=0, allow_inf_nan=False, description="Peak learning rate of the LoRA weights.")
    grad_accum: int = Field(1, gt=0, description="Steps whose gradients add up to one update.")
    save_steps: int = Field(20, gt=0, description="Save a resumable checkpoint every this many steps.")


class GRPO(GRPOVariants):
    """Reinforcement learning with verifiable rewards: TRL's GRPOTrainer (dragon_reinforce)."""

    kind: Literal["grpo"]
    rewards: list[RewardSpec] = Field(
        min_length=1,
        description="Verifiable rewards, summed by weight, e.g. [{type: numeric}, "
        "{type: length, max_chars: 16, weight: 0.2}]; see the rewards reference for the types and their options.",
    )
    group_size: int = Field(4, ge=2, le=64, description="Completions per prompt, 2..64.")
    beta: float = Field(0.04, ge=0, le=10, description="KL penalty to the starting model, 0..10.")
    temperature: float = Field(1.0, ge=0.05, le=3, description="Sampling temperature, 0.05..3.")
    max_new_tokens: int = Field(
        128,
        gt=0,
        description="Rollout length: the most tokens a sampled completion may have while training (TRL's "
        "max_completion_length), and the length limit of the held-out replies scored before and after.",
    )
    max_eval_prompts: int = Field(64, ge=0, description="Held-out prompts scored before and after training.")
    kl_bound: float = Field(1.0, gt=0, description="The kl_within_bound check warns above this KL.")
    zero_std_limit: float = Field(
        0.9,
        gt=0,
        le=1,
        description="The groups_have_reward_variance check warns when this share of groups has no reward variance.",
    )
    truncation_limit: float = Field(
        0.25,
        gt=0,
        le=1,
        description="The completions_not_truncated check warns when more than this share of completions is cut off "
        "at max_new_tokens (mean over the steps).",
    )
    tools: bool = Field(
        False,
        description="Run the pipeline's tools in the rollouts: a completion that calls a tool gets the result "
        "appended and generation goes on (TRL's tool loop, up to the tools' max_calls), so rewards score the final "
        "answer and tool_call scores the calls. Needs `tools:` declared in the pipeline. Rollouts then take TRL's "
        "own generation path: the grouped sampler prefills a group's prompt once and samples the group in "
        "lockstep, which a tool call in the middle of one completion breaks.",
    )
    block_on_reward_hacking: bool = Field(
        False,
        description="Make format_not_rising_while_accuracy_falls a blocking check with severity ERROR: when "
        "it fails, the stages after this one are not materialized in the same run.",
    )
    args: GRPOArgs = Field(default_factory=GRPOArgs, description="Trainer arguments.")

    _known_reward_types = known_types("rewards", "rewards")

    def rewards_used(self) -> list[dict[str, Any]]:
        return [reward.model_dump() for reward in self.rewards]

    def with_rewards(self, specs: list[dict[str, Any]]) -> GRPO:
        return type(self).model_validate({**self.model_dump(), "rewards": specs})

    def check_inputs(self, pipeline) -> None:
        """tools: true needs the pipeline's tools; a tool_call reward needs the calls run (tools: true)."""
        if self.tools and getattr(pipeline, "tools", None) is None:
            raise ValueError(
                f"grpo stage {self.name!r} has tools: true, but the pipeline declares no tools: add "
                "`tools: {file: tools.py}` (or schemas) to the pipeline"
            )
        scoring_calls = [r.name for r in self.rewards if r.type == "tool_call"]
        if scoring_calls and not self.tools:
            raise ValueError(
                f"grpo stage {self.name!r}: reward(s) {scoring_calls} score tool calls, which the rollouts make only "
                "with tools: true"
            )

    def preflight(self, pipeline) -> list[str]:
        """A reward that compares with a reference, on prompts whose dataset maps no reference column."""
        prompts = pipeline.stage(self.dataset)
        needing = [r.name or r.type for r in self.rewards if r.needs_reference]
        maps_reference = "reference" in type(prompts).model_fields
        if needing and maps_reference and not prompts.reference:
            return [
                f"{self.name}: reward(s) {needing} compare with a reference, but {prompts.name} "
                "maps no reference column"
            ]
        return []
