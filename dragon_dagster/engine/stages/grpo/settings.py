"""The grpo kind's settings: reinforcement learning with verifiable rewards (dragon_reinforce), TRL's GRPO loss
variants (variants.py) and tools in the rollouts; what it shares with rloo is train/reinforce/settings.py."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ...train.reinforce.settings import ReinforceArgs
from .variants import GRPOVariants

GRPOArgs = ReinforceArgs  # the name the feedback retraining's settings use


class GRPO(GRPOVariants):
    """Reinforcement learning with verifiable rewards: TRL's GRPOTrainer (dragon_reinforce)."""

    kind: Literal["grpo"]
    tools: bool = Field(
        False,
        description="Run the pipeline's tools in the rollouts: a completion that calls a tool gets the result "
        "appended and generation goes on (TRL's tool loop, up to the tools' max_calls), so rewards score the final "
        "answer and tool_call scores the calls. Needs `tools:` declared in the pipeline. Rollouts then take TRL's "
        "own generation path: the grouped sampler prefills a group's prompt once and samples the group in "
        "lockstep, which a tool call in the middle of one completion breaks.",
    )

    def check_inputs(self, pipeline) -> None:
        """What every reinforcement kind checks; then tools: true needs the pipeline's tools, and a tool_call
        reward needs the calls run (tools: true)."""
        super().check_inputs(pipeline)
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

    drop_flat_groups: bool = Field(
        False,
        description="Leave the groups whose completions all scored the same out of the loss (DAPO's dynamic "
        "sampling, without its resampling): they carry no advantage, and counted in the loss's token average "
        "they only dilute the groups that do. The share dropped per step is logged (flat_groups_dropped).",
    )

    def drops_flat_groups(self) -> bool:
        return self.drop_flat_groups

    def uses_tools(self) -> bool:
        return self.tools
