"""A stage kind from outside the package, as a plugin would add one: this folder and one registration.

`toy_adapter` saves a fresh LoRA adapter on the model it starts from (no training: its update is zero, so the
merged model equals its base) and reports how many parameters the adapter has. It is a training kind, so the
stages after it (merge, evaluate) treat it as any other adapter. With `teacher:` it declares one more input, in a
role of its own (as a distillation kind reads its teacher): the Dagster layer draws the lineage edge and the job
carries the teacher's artifact, which the result names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from dragon_dagster.engine import catalog
from dragon_dagster.engine.config.checks import CheckOutcome, CheckSpec
from dragon_dagster.engine.config.job import Job, TrainingInputs
from dragon_dagster.engine.config.kind import StageKind
from dragon_dagster.engine.config.reporter import Reporter
from dragon_dagster.engine.config.results import TrainingResult
from dragon_dagster.engine.config.stage import StageInput
from dragon_dagster.engine.train.stage import TrainerStage

TEACHER = "teacher"  # the role of the stage a toy adapter reads as its teacher


class ToyAdapter(TrainerStage):
    """A LoRA adapter saved untrained."""

    kind: Literal["toy_adapter"]
    note: str = Field("untrained", description="Written into the result, to show a kind's own setting arrive.")
    teacher: str | None = Field(None, description="An earlier stage read as its teacher (a declared input).")

    def extra_inputs(self) -> list[StageInput]:
        return [*super().extra_inputs(), *([StageInput(TEACHER, self.teacher)] if self.teacher else [])]


class ToyResult(TrainingResult):
    lora_parameters: int
    note: str
    teacher_artifact: str | None = None  # the teacher's artifact, as the job carried it

    def own_figures(self) -> dict[str, Any]:
        return {"lora_parameters": self.lora_parameters}


def save_adapter(job: Job[ToyAdapter, TrainingInputs], reporter: Reporter) -> ToyResult:
    from peft import get_peft_model

    from dragon_dagster.engine.models import load_model, load_tokenizer
    from dragon_dagster.engine.train.trainer import lora_config

    model = get_peft_model(
        load_model(job.inputs.model, job.hardware, adapters=job.inputs.adapters), lora_config(job.settings.lora)
    )
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    adapter = Path(job.output_dir) / "adapter"
    model.save_pretrained(adapter)
    load_tokenizer(job.inputs.model).save_pretrained(adapter)
    reporter.log(f"toy adapter: {trainable} LoRA parameters, saved untrained")
    teachers = job.inputs.declared_as(TEACHER)
    return ToyResult(
        objective="toy_adapter",
        loss_label="no loss (untrained)",
        lora_parameters=trainable,
        note=job.settings.note,
        teacher_artifact=teachers.get(job.settings.teacher) if job.settings.teacher else None,
    )


def adapter_saved() -> CheckSpec:
    def judge(artifact: Path) -> CheckOutcome:
        saved = (artifact / "adapter" / "adapter_config.json").exists()
        return CheckOutcome(saved, {"adapter_config": saved}, None if saved else "no adapter was saved")

    return CheckSpec("toy_adapter_saved", "The adapter's files are in the artifact.", judge)


KIND = catalog.register(
    StageKind(
        ToyAdapter,
        "training",
        TrainingInputs,
        ToyResult,
        f"{__name__}:save_adapter",
        lambda stage: [adapter_saved()],
        summary="A LoRA adapter saved untrained (a test's toy kind).",
    )
)
