"""What a reinforcement stage (grpo, rloo) reports: each reward's mean on held-out prompts before and after
training, and how many completions were cut off at max_new_tokens (with a length to try when too many were)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from ...config.results import TrainingResult, fig


class ReinforceResult(TrainingResult):
    eval_prompts: int = 0
    reward_kinds: dict[str, str] = Field(default_factory=dict, description="Each reward's type, by name.")
    reward_before: float | None = None  # weighted total on the held-out prompts, adapter off (the start)
    reward_after: float | None = None
    per_reward_before: dict[str, float] = Field(default_factory=dict)
    per_reward_after: dict[str, float] = Field(default_factory=dict)
    reward_errors: dict[str, int] = Field(default_factory=dict)
    guard_kinds: dict[str, str] = Field(
        default_factory=dict, description="What the stage watched but never trained on: each guard's type, by name."
    )
    guard_before: dict[str, float] = Field(default_factory=dict)  # each guard's mean on the held-out prompts
    guard_after: dict[str, float] = Field(default_factory=dict)
    difficulty: dict[str, float] | None = Field(
        None,
        description="The difficulty filter's findings: prompts scored, samples each, kept (right some of the time), "
        "always right, never right, the kept share.",
    )
    kl: float | None = None  # mean KL to the starting model over the last third of the logged steps
    group_size: int
    beta: float
    beta_end: float | None = Field(
        None, description="The KL coefficient at the end: where the adaptive controller (kl_target) left it."
    )
    temperature: float
    max_new_tokens: int
    clipped_ratio: float | None = None  # mean share of training completions cut off at max_new_tokens
    longest_reference_tokens: int | None = None
    suggested_max_new_tokens: int | None = None
    tools: dict | None = Field(
        None,
        description="With tools in the loop: the tools, their rendering (native or fallback) and the calls run "
        "in training and in the before/after scoring (calls, errors, timeouts).",
    )

    def own_figures(self) -> dict[str, Any]:
        figures = {"reward_before": self.reward_before, "reward_after": self.reward_after}
        figures.update({f"reward_before/{n}": v for n, v in self.per_reward_before.items()})
        figures.update({f"reward_after/{n}": v for n, v in self.per_reward_after.items()})
        figures.update({f"guard_before/{n}": v for n, v in self.guard_before.items()})
        figures.update({f"guard_after/{n}": v for n, v in self.guard_after.items()})
        for change in self.pass_at_k:
            for when in ("before", "after"):
                figures[f"pass_at_1_{when}/{change.reward}"] = getattr(change, f"pass1_{when}")
                figures[f"pass_at_{change.k}_{when}/{change.reward}"] = getattr(change, f"passk_{when}")
        if self.kl is not None:
            figures["kl"] = self.kl
        return figures

    def metadata(self) -> dict[str, Any]:
        tools = {f"tools/{k}": v for k, v in (self.tools or {}).items() if k != "names"}
        if self.tools:
            tools["tools"] = ", ".join(self.tools["names"])
        return {
            **super().metadata(),
            "clipped_ratio": self.clipped_ratio,
            **{f"difficulty/{k}": v for k, v in (self.difficulty or {}).items()},
            "max_new_tokens": self.max_new_tokens,
            **tools,
        }

    @classmethod
    def headline(cls, metrics: dict[str, float]) -> str:
        """Reward before -> after on held-out prompts (each reward's after), the last training reward and KL."""
        parts = []
        if "eval/reward" in metrics or "eval/reward_before" in metrics:
            parts.append(f"reward {fig(metrics.get('eval/reward_before'))} -> {fig(metrics.get('eval/reward'))}")
        per_reward = {
            k[len("eval/reward_") :]: v
            for k, v in sorted(metrics.items())
            if k.startswith("eval/reward_") and k not in ("eval/reward_before", "eval/reward_margin")
        }
        if per_reward:
            each = "(" + ", ".join(f"{name} {fig(v)}" for name, v in per_reward.items()) + ")"
            parts[-1:] = [f"{parts[-1]} {each}"] if parts else [each]
        guards = sorted(k[len("eval/guard_") :] for k in metrics if k.startswith("eval/guard_") and "before_" not in k)
        if guards:
            parts.append(
                "guard "
                + ", ".join(
                    f"{n} {fig(metrics.get(f'eval/guard_before_{n}'))} -> {fig(metrics[f'eval/guard_{n}'])}"
                    for n in guards
                )
            )
        if "train/reward" in metrics:
            parts.append(f"train reward {fig(metrics['train/reward'])}")
        if "train/kl" in metrics:
            parts.append(f"kl {fig(metrics['train/kl'])}")
        if not parts and "train/loss" in metrics:
            parts.append(f"train loss {fig(metrics['train/loss'])}")
        return ", ".join(parts)
