"""The distill kind's settings: on-policy distillation (TRL's DistillationConfig), the student a LoRA adapter, the
teacher an earlier stage or a model named by where it is.

TRL 1.16's DistillationTrainer samples every completion from the student (on-policy, GKD's lmbda = 1): it has
no share of the dataset's own replies to set, so this kind has no `lmbda`; a stage that sets one is told so.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from ...config.settings import Settings
from ...config.stage import METRICS_DOC, MetricNames, ModelReference, StageInput
from ...config.training import TrainArgs
from ...train.stage import TrainerStage, check_trains_on

TEACHER = "teacher"  # the role of the model a distill stage learns from (StageInput, ModelReference)


class Teacher(Settings):
    """The model to learn from: an earlier stage of the pipeline, or a model named by where it is."""

    stage: str | None = Field(
        None,
        description="An earlier stage whose model teaches: a training stage (its adapter chain) or a merge. Its "
        "asset is an input of this one (a lineage edge).",
    )
    model: str | None = Field(
        None,
        description="A model by where it is: a registered model (models:/support@champion, models:/support/3), a "
        "preset, a Hugging Face id or a local directory. A registered model is resolved when the stage runs, and "
        "the version read is recorded.",
    )

    @model_validator(mode="after")
    def _one(self):
        if (self.stage is None) == (self.model is None):
            raise ValueError(
                "teacher: give exactly one of `stage` (an earlier stage of this pipeline) or `model` "
                "(models:/name@alias, a preset, a hub id or a directory), e.g. teacher: {stage: sft_adapter}"
            )
        return self

    def named(self) -> str:
        return f"stage {self.stage}" if self.stage else str(self.model)


class DistillArgs(TrainArgs):
    """Distillation's defaults: each step samples from the student, so one pass and no accumulation."""

    epochs: float = Field(1, gt=0, description="Passes over the prompts.")
    learning_rate: float = Field(
        1e-4,
        gt=0,
        allow_inf_nan=False,
        description="Peak learning rate of the LoRA weights (TRL's 1e-6 is for full fine-tuning; LoRA needs more).",
    )
    grad_accum: int = Field(1, gt=0, description="Steps whose gradients add up to one update.")
    save_steps: int = Field(20, gt=0, description="Save a resumable checkpoint every this many steps.")


class Distill(TrainerStage):
    """On-policy distillation: the student answers the prompts and learns the teacher's next-token distribution
    over its own answers (TRL's DistillationTrainer, generalized Jensen-Shannon divergence)."""

    kind: Literal["distill"]
    trains_on: ClassVar[tuple[str, ...]] = ("prompts", "chat")

    dataset: str = Field(
        description="An earlier prompt_dataset or chat dataset whose prompts the student answers (a chat row's "
        "reply is not trained on; it measures the held-out NLL)."
    )
    teacher: Teacher = Field(description="The model to learn from; it must share the student's tokenizer.")
    student: Literal["chain", "base"] = Field(
        "chain",
        description="chain: the student continues from the training stage before it (earlier adapters folded in); "
        "base: a fresh adapter on the pipeline's model (distil a teacher into the model as it was).",
    )
    beta: float = Field(
        1.0,
        ge=0,
        le=1,
        description="Which divergence, 0..1 (TRL's default 1): 0 the forward KL(teacher || student), which "
        "spreads the student over what the teacher finds likely; 1 the reverse KL(student || teacher), which "
        "keeps it on the teacher's likeliest answers (mode-seeking, the usual choice on-policy); 0.5 the "
        "Jensen-Shannon divergence.",
    )
    temperature: float = Field(
        1.0,
        ge=0.05,
        le=3,
        description="Temperature of the student's sampling and of both distributions in the divergence.",
    )
    max_new_tokens: int = Field(
        128,
        gt=0,
        description="The most tokens a sampled completion has (TRL's max_completion_length, 512 by default: "
        "128 here keeps a CPU step short), and the length limit of the held-out replies.",
    )
    max_eval_prompts: int = Field(
        32, ge=0, description="Held-out prompts on which the student, before and after, and the teacher are measured."
    )
    metrics: MetricNames = Field(None, description=METRICS_DOC)
    args: DistillArgs = Field(default_factory=DistillArgs, description="Trainer arguments.")

    @model_validator(mode="before")
    @classmethod
    def _no_lmbda(cls, data: Any) -> Any:
        if isinstance(data, dict) and "lmbda" in data:
            raise ValueError(
                f"distill stage {data.get('name')!r}: lmbda (the share of the student's own samples) is not a "
                "setting of TRL 1.16's DistillationTrainer, which always trains on the student's samples "
                "(on-policy, lmbda 1): remove lmbda"
            )
        return data

    def continues_chain(self) -> bool:
        return self.student == "chain"

    def extra_inputs(self) -> list[StageInput]:
        return [StageInput(TEACHER, self.teacher.stage)] if self.teacher.stage else []

    def model_references(self) -> list[ModelReference]:
        return [ModelReference(TEACHER, self.teacher.model)] if self.teacher.model else []

    def check_inputs(self, pipeline) -> None:
        """Prompts to answer; a teacher stage that has a model and is not the student itself; a teacher model
        whose tokenizer (when it is on this machine) is the student's."""
        check_trains_on(self, pipeline)
        if self.teacher.stage:
            teacher = pipeline.stage_or_none(self.teacher.stage)
            role = pipeline.role_of(teacher) if teacher else None
            if role not in ("training", "merge") or not teacher.in_chain:
                raise ValueError(
                    f"distill stage {self.name!r}: teacher stage {self.teacher.stage!r} is "
                    f"{'a ' + teacher.kind + ' stage' if teacher else 'not a stage'}, which has no model to learn "
                    "from; name an earlier training stage or merge"
                )
            if self.teacher.stage == pipeline.previous(self.name):
                raise ValueError(
                    f"distill stage {self.name!r}: the teacher {self.teacher.stage!r} is the model the student "
                    "starts from (student: chain continues from it), so there is nothing to learn: set student: "
                    "base, or name another teacher"
                )
        elif not self.teacher.model.startswith("models:/"):  # a registered model is checked when it is read
            from ...models import tokenizer_mismatch_on_disk

            why = tokenizer_mismatch_on_disk(pipeline.model, self.teacher.model)
            if why:
                raise ValueError(
                    f"distill stage {self.name!r}: teacher {self.teacher.model!r} does not share the student's "
                    f"tokenizer ({pipeline.model}): {why}. Distillation compares the two models' next-token "
                    "distributions token id by token id; use a teacher of the same model family"
                )
