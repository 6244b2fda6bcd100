"""What a worker sends back: one result model per kind (stages/<kind>/result.py), all built on these bases.

The worker returns its kind's model; the Dagster layer validates the outcome with the same model, writes it into
the artifact's manifest, and every reader (checks, report, runs listing, model card, tests) reads it back through
a model: the kind's own where it needs the kind's fields, `TrainingSummary` where any training stage will do.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import ConfigDict, Field, model_validator

from .job import Contract

# A legacy training result (written before results had `figures`) shows these, where it has them.
LEGACY_FIGURES = (
    "eval_loss",
    "perplexity",
    "preference_loss",
    "pref_accuracy",
    "reward_margin",
    "reward_before",
    "reward_after",
)


def finite(values: dict[str, Any]) -> dict[str, float]:
    """Only the finite numbers of a mapping (no None, NaN or booleans), as floats."""
    return {
        k: float(v)
        for k, v in values.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }


# What each run's row in a comparison carries besides the headline: every held-out figure and the judge's.
ROW_METRICS = ("eval/", "judge/")


def fig(value) -> str:
    return f"{value:.4g}" if isinstance(value, (int, float)) else "?"


class StageResult(Contract):
    """What a worker reports when its job is done."""

    def metadata(self) -> dict[str, Any]:
        """What the asset's page shows of this result (numbers, text, `Markdown`, tables as lists of rows)."""
        return {}

    @classmethod
    def headline(cls, metrics: dict[str, float]) -> str:
        """A run's own figures in one line, from the metrics its MLflow run logged (the loss is a column of its
        own): held-out perplexity and task metrics, or the last training loss of a run stopped before them."""
        shown = {k: v for k, v in metrics.items() if k.startswith(ROW_METRICS) and k != "eval/loss"}
        first = [k for k in ("eval/perplexity",) if k in shown]
        parts = [f"{key.removeprefix('eval/')} {fig(shown[key])}" for key in first + sorted(set(shown) - set(first))]
        if not parts and "train/loss" in metrics:
            parts.append(f"train loss {fig(metrics['train/loss'])}")
        return ", ".join(parts)


class PassAtK(Contract):
    """One accuracy-like reward's pass@1 and pass@k, a model against the one before it on the same prompts: each
    prompt sampled `samples` times at `temperature` by both, the unbiased estimator averaged over the prompts, the
    prompts whose right count rose or fell, the exact sign test's two-sided p-value and its verdict."""

    reward: str
    model: str = Field(description='What was measured: "merged", or a stage\'s name (its model after training).')
    against: str = Field(description='What it is compared with: "base", or "start" (a stage\'s starting model).')
    prompts: int
    samples: int
    k: int
    temperature: float
    pass1_before: float
    pass1_after: float
    passk_before: float
    passk_after: float
    prompts_up: int
    prompts_down: int
    p_value: float
    verdict: str = Field(description='"better", "worse" or "no measurable change" at the sign test\'s level.')

    def figures(self, when: str) -> dict[str, float]:
        """Its pass@1 and pass@k "before" or "after", under the names every run logs them by: pass_at_1_<reward>,
        pass_at_<k>_<reward> (MLflow refuses '@' in a name)."""
        return {
            f"pass_at_1_{self.reward}": getattr(self, f"pass1_{when}"),
            f"pass_at_{self.k}_{self.reward}": getattr(self, f"passk_{when}"),
        }

    def compared_with(self) -> str:
        """What it is compared with, in words."""
        return "its start" if self.against == "start" else self.against


class HeldOutRows(Contract):
    """How many held-out rows were scored (while training and after it), out of the split's."""

    scored: int
    total: int
    setting: str = "args.max_eval_rows"  # the setting that bounds them (an evaluate stage's is max_eval_rows)

    @property
    def sampled(self) -> bool:
        return self.scored < self.total

    def sentence(self) -> str:
        sampled = f" (a seeded sample: {self.setting})" if self.sampled else ""
        return f"{self.scored} of {self.total}{sampled}"


class KeptAdapter(Contract):
    """Which step the adapter holds and why: the held-out metric scored every eval_every steps, the best
    evaluation, whether early stopping ended training before its planned steps."""

    keep: str = Field(description="'best' or 'last': the stage's args.keep.")
    step: int = Field(description="The training step whose weights the adapter holds.")
    metric: str = Field(description="The held-out figure that ranks the evaluations (eval_loss, ...).")
    greater_is_better: bool = False
    best_step: int | None = Field(None, description="The evaluation with the best metric.")
    best_metric: float | None = None
    evaluations: int = 0
    eval_every: int
    last_step: int = Field(description="Where training ended.")
    planned_steps: int = Field(description="Where it would have ended without early stopping.")
    stopped_early: bool = False
    patience: int | None = Field(None, description="Early stopping's patience, in evaluations (None: no early stop).")

    def label(self) -> str:
        name = self.metric.removeprefix("eval_")
        return f"held-out {name}"

    def sentence(self) -> str:
        """E.g. 'stopped at step 140 of 400 (held-out loss did not improve for 3 evaluations); kept step 80, the
        best held-out loss (1.234)'."""
        if self.stopped_early:
            ran = (
                f"stopped at step {self.last_step} of {self.planned_steps} ({self.label()} did not improve for "
                f"{self.patience} evaluations)"
            )
        else:
            ran = f"ran {self.last_step} of {self.planned_steps} steps"
        best = f"the best {self.label()} ({fig(self.best_metric)}) at step {self.best_step}"
        if self.keep == "best" and self.step == self.best_step:
            kept = f"kept step {self.step}, {best}"
        else:
            kept = f"kept the last step ({self.step})" + (f"; {best}" if self.best_step is not None else "")
        return f"{ran}; {kept}"


class TrainingResult(StageResult):
    """What every training stage's result has. A kind fills `own_figures` (its held-out figures: the report's
    stage table, the model card, the asset page and the MLflow run's headline all show them)."""

    objective: str = Field(description="What was trained: sft, dpo, orpo, kto, grpo ... (the MLflow `method` tag).")
    loss_label: str = Field("training loss", description="What the loss curve of this stage measures.")
    global_step: int = 0
    train_loss: float | None = None
    first_loss: float | None = None
    last_loss: float | None = None
    held_out: bool = False
    speed: dict[str, Any] = Field(default_factory=dict, description="The speed settings the run used.")
    figures: dict[str, float] = Field(default_factory=dict, description="The stage's own held-out figures.")
    rewards: list[dict[str, Any]] = Field(
        default_factory=list, description="Rewards the stage optimized (custom files relative to its artifact)."
    )
    pass_at_k: list[PassAtK] = Field(
        default_factory=list,
        description="A sampling stage's pass@1 and pass@k on its held-out prompts, its model against its start.",
    )
    temperature: float | None = Field(None, description="The temperature a sampling stage sampled at.")
    kept: KeptAdapter | None = Field(
        None, description="Which step the adapter holds and why (with held-out evaluation while training)."
    )
    held_out_rows: HeldOutRows | None = Field(None, description="Held-out rows scored, out of the split's.")

    def own_figures(self) -> dict[str, Any]:
        return {}

    def metadata(self) -> dict[str, Any]:
        """The losses and the stage's own figures; a kind adds what else its asset page shows."""
        return {
            "train_loss": self.train_loss,
            "first_loss": self.first_loss,
            "last_loss": self.last_loss,
            **self.figures,
            **({"adapter_step": self.kept.sentence()} if self.kept else {}),
            **({"held_out_rows": self.held_out_rows.sentence()} if self.held_out_rows else {}),
        }

    @model_validator(mode="after")
    def _fill_figures(self):
        if not self.figures:
            self.figures = finite(self.own_figures())
        return self


class TrainingSummary(TrainingResult):
    """Any training stage's result read without its kind: the shared fields, the kind's own ones ignored. An old
    manifest's result (no objective, no figures) reads too, its figures taken from the keys it has."""

    model_config = ConfigDict(extra="allow")

    objective: str = ""

    def own_figures(self) -> dict[str, Any]:
        extra = self.model_extra or {}
        figures = {k: extra[k] for k in LEGACY_FIGURES if k in extra}
        for when in ("before", "after"):
            figures.update({f"reward_{when}/{n}": v for n, v in (extra.get(f"per_reward_{when}") or {}).items()})
        return figures


class Markdown(str):
    """Text an asset's page renders as Markdown (a result's `metadata`)."""
