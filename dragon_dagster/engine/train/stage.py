"""What every training stage kind shares: the dataset it trains on, the adapter's shape, the trainer arguments,
the samples it writes after training, and the check every adapter gets (its loss is finite and falls)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import ClassVar

from pydantic import Field, model_validator

from ..artifacts import progress
from ..config.checks import CheckOutcome, CheckSpec
from ..config.stage import Continues, Stage, StageInput
from ..config.training import Lora, TrainArgs
from ..rewards import Reward

SCORER = "scorer"  # the role of a reward model that scores a stage's samples (StageInput)

# The rows a dataset holds (a dataset kind's `makes`): what a kind that names its rows can train on (`trains_on`).
ROW_SHAPES = {
    "pairs": "pairs (chosen and rejected replies)",
    "rated": "rated replies (liked or disliked)",
    "prompts": "prompts (a prompt column, references optional)",
    "chat": "conversations (prompts and replies)",
}


class TrainerStage(Stage):
    """A LoRA adapter trained on a dataset, continuing from the training stage before it (folded in)."""

    continues: ClassVar[Continues] = "optional"

    dataset: str = Field(description="An earlier dataset stage whose rows train this stage.")
    lora: Lora = Field(default_factory=Lora, description="The adapter's shape (dragon_lora).")
    args: TrainArgs = Field(default_factory=TrainArgs, description="Trainer arguments (dragon_train_args).")
    n_samples: int = Field(10, ge=0, description="Held-out prompts answered after training (samples.jsonl).")
    max_new_tokens: int = Field(128, gt=0, description="Length limit of sample replies.")

    @model_validator(mode="after")
    def _init_keeps_the_start(self):
        why = self.base_changing_init_problem()
        if why and self.lora.changes_base():
            raise ValueError(
                f"stage {self.name!r} ({self.kind}): lora.init {self.lora.init} moves the top of each base weight "
                f"into the adapter while training (the model with its adapter off is no longer the model the stage "
                f"started from, and the adapter is saved converted to a plain LoRA on the untouched base), but "
                f"{why}. Use lora.init gaussian for this stage"
            )
        return self

    def base_changing_init_problem(self) -> str | None:
        """Why this stage cannot train with a base-changing LoRA init (PiSSA, OLoRA, LoftQ): what in its training
        takes the adapter-off model as its start. None when nothing does."""
        return None

    def objective(self) -> str:
        """The training objective, as tagged in MLflow (`method`) and shown in the report."""
        return self.kind

    def reads(self) -> list[str]:
        return [self.dataset, *(extra.stage for extra in self.extra_inputs())]

    def extra_inputs(self) -> list[StageInput]:
        return [StageInput(SCORER, name) for name in self.scorers()]

    def scorers(self) -> list[str]:
        """Reward-model stages whose models score this stage's samples (its asset reads them: a lineage edge)."""
        return []

    def rewards_used(self) -> list[Reward]:
        """The rewards this stage optimizes (custom files relative to the pipeline's folder): the Dagster step
        checks them against the data before the worker starts, and copies custom files along."""
        return []

    def with_rewards(self, rewards: list[Reward]) -> TrainerStage:
        """These settings with their rewards replaced (custom files copied beside the artifact)."""
        return self


def losses_check() -> CheckSpec:
    def judge(artifact: Path) -> CheckOutcome:
        losses = [r["loss"] for r in progress.read(artifact) if r.get("loss") is not None]
        finite = all(math.isfinite(x) for x in losses)
        falling = len(losses) >= 2 and losses[-1] < losses[0]
        passed = bool(losses) and finite and falling
        if passed:
            description = None
        elif len(losses) < 2:
            description = (
                f"{len(losses)} training loss logged, too few to tell a trend: train more steps (args.max_steps or "
                "args.epochs) or log more often (args.logging_steps)."
            )
        elif not finite:
            description = "A training loss is not finite (NaN or inf): lower args.learning_rate."
        else:
            description = (
                f"The last logged loss ({losses[-1]:.4g}) is not below the first ({losses[0]:.4g}): train more steps "
                "(args.max_steps or args.epochs) or change args.learning_rate."
            )
        return CheckOutcome(
            passed=passed,
            description=description,
            severity="error",
            metadata={
                "logged_steps": len(losses),
                "all_finite": finite,
                "first_loss": losses[0] if losses else -1.0,
                "last_loss": losses[-1] if losses else -1.0,
            },
        )

    return CheckSpec(
        "losses_finite_and_falling", "Every logged training loss is finite and the last is below the first.", judge
    )


def adapter_checks(stage: Stage) -> list[CheckSpec]:
    return [losses_check()]


def check_trains_on(stage: TrainerStage, pipeline) -> None:
    """The stage's dataset must be a mapped one that holds rows the kind trains on (its `trains_on`; pipeline:
    `stage_or_none`, `kinds_making(shape)`, `kinds_training_on(shape)`)."""
    wanted = " or ".join(k for shape in stage.trains_on for k in pipeline.kinds_making(shape))
    data = pipeline.stage_or_none(stage.dataset)
    if data is None:
        raise ValueError(f"stage {stage.name!r} names {stage.dataset!r}, a source file: map it with a {wanted} first")
    makes = getattr(data, "makes", None)
    if makes in stage.trains_on:
        return
    others = [k for k in pipeline.kinds_training_on(makes) if k != stage.kind] if makes else []
    raise ValueError(
        f"stage {stage.name!r} ({stage.kind}) trains on {' or '.join(ROW_SHAPES[s] for s in stage.trains_on)}: "
        f"its dataset "
        f"{stage.dataset!r} is a {data.kind}; use a {wanted}"
        + (f", or kind: {' or '.join(others)} for {ROW_SHAPES.get(makes, makes)}" if others else "")
    )
