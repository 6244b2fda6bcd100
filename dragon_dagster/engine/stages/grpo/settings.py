"""The grpo kind's settings: reinforcement learning with verifiable rewards (dragon_reinforce)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ...config.stage import METRICS_DOC, MetricNames
from ...config.training import TrainArgs
from ...rewards import LEARNED_TYPES, Reward, RewardSpec, known_types
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
    guard: list[RewardSpec] = Field(
        default_factory=list,
        description="Rewards never trained on, scored on the held-out prompts before and after training: what a "
        "policy exploiting a learned reward (reward_model) would lose while its reward climbs, e.g. a verifiable "
        "reward or a second reward model. The reward-hacking check compares them with the learned rewards.",
    )
    guard_metrics: MetricNames = Field(
        None,
        description="Reference metrics of the held-out replies watched the same way (prompts with a reference "
        "column). Default: token_f1 when the stage optimizes a learned reward and the prompts have references. "
        + METRICS_DOC.split(". ", 1)[0]
        + ".",
    )
    block_on_reward_hacking: bool = Field(
        False,
        description="Make format_not_rising_while_accuracy_falls a blocking check with severity ERROR: when "
        "it fails, the stages after this one are not materialized in the same run.",
    )
    args: GRPOArgs = Field(default_factory=GRPOArgs, description="Trainer arguments.")

    _known_reward_types = known_types("rewards", "rewards")
    _known_guard_types = known_types("guard", "guard")

    def rewards_used(self) -> list[Reward]:
        """The trained rewards, then the guard's (one list: the step checks and copies them alike)."""
        return [*self.rewards, *self.guard]

    def with_rewards(self, rewards: list[Reward]) -> GRPO:
        n = len(self.rewards)
        return self.model_copy(update={"rewards": rewards[:n], "guard": rewards[n:]})

    def learned_rewards(self) -> list[str]:
        return [r.name for r in self.rewards if r.type in LEARNED_TYPES]

    def scorers(self) -> list[str]:
        return list(dict.fromkeys(r.stage for r in [*self.rewards, *self.guard] if r.type in LEARNED_TYPES))

    def watched_metrics(self, has_references: bool) -> list[str]:
        """The reference metrics scored before and after: guard_metrics, else token_f1 for a learned reward."""
        if self.guard_metrics is not None:
            return self.guard_metrics
        return ["token_f1"] if self.learned_rewards() and has_references else []

    def check_inputs(self, pipeline) -> None:
        """tools: true needs the pipeline's tools; a tool_call reward needs the calls run (tools: true); a
        reward_model reward names a reward_model stage; a learned reward has something untrained to watch."""
        for name in self.scorers():
            scorer = pipeline.stage_or_none(name)
            if scorer is None or not scorer.scores_replies:
                raise ValueError(
                    f"grpo stage {self.name!r}: a reward_model reward names {name!r}, which is "
                    f"{'a ' + scorer.kind + ' stage' if scorer else 'not a stage'}; name an earlier reward_model "
                    "stage"
                )
        learned = self.learned_rewards()
        prompts = pipeline.stage_or_none(self.dataset)
        references = bool(getattr(prompts, "reference", None))
        if learned and not self.guard and not references:
            raise ValueError(
                f"grpo stage {self.name!r} optimizes the learned reward(s) {learned} and watches nothing it is not "
                "trained on, so over-optimization would go unseen: add `guard:` (a verifiable reward or another "
                f"reward model) or map a reference column in {self.dataset!r} (its token_f1 is then watched)"
            )
        if self.guard_metrics and not references:
            raise ValueError(
                f"grpo stage {self.name!r}: guard_metrics {self.guard_metrics} compare with references, but "
                f"{self.dataset!r} maps no reference column"
            )
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
