"""A stage kind from outside the package, as a plugin would add one: this folder and one registration.

`toy_adapter` saves a fresh LoRA adapter on the model it starts from (no training: its update is zero, so the
merged model equals its base) and reports how many parameters the adapter has. It is a training kind, so the
stages after it (merge, evaluate) treat it as any other adapter.
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
from dragon_dagster.engine.train.stage import TrainerStage


class ToyAdapter(TrainerStage):
    """A LoRA adapter saved untrained."""

    kind: Literal["toy_adapter"]
    note: str = Field("untrained", description="Written into the result, to show a kind's own setting arrive.")


class ToyResult(TrainingResult):
    lora_parameters: int
    note: str

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
    return ToyResult(
        objective="toy_adapter", loss_label="no loss (untrained)", lora_parameters=trainable, note=job.settings.note
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
