"""The stage kinds: for each, its settings model, its role in the pipeline, the worker job that runs it and
the asset checks that guard it. The Dagster layer builds assets and checks by looking a kind up here, and
the worker dispatches on it; adding a kind is one entry.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import Field, TypeAdapter

from . import stages as s

Role = Literal["dataset", "synthesis", "training", "merge", "evaluate", "export"]


@dataclass(frozen=True)
class StageKind:
    model: type[s.Stage]
    role: Role
    worker: str | None = None  # "module:JobClass:function"; None: the stage runs in the Dagster step
    checks: tuple[str, ...] = ()  # check families the Dagster layer attaches to the stage's asset

    def load_worker(self):
        """(job class, function) of the worker job, imported on first use so the registry stays light."""
        module, job_class, function = self.worker.split(":")
        loaded = importlib.import_module(module)
        return getattr(loaded, job_class), getattr(loaded, function)


_ENGINE = "dragon_dagster.engine"
KINDS: dict[str, StageKind] = {
    "chat_dataset": StageKind(s.ChatDataset, "dataset", checks=("dataset_quality", "held_out_leakage")),
    "pairs_dataset": StageKind(s.PairsDataset, "dataset", checks=("dataset_quality", "held_out_leakage")),
    "rated_dataset": StageKind(s.RatedDataset, "dataset", checks=("dataset_quality", "held_out_leakage")),
    "prompt_dataset": StageKind(s.PromptDataset, "dataset", checks=("dataset_quality", "held_out_leakage")),
    "preference_pairs": StageKind(
        s.PreferencePairs, "synthesis", f"{_ENGINE}.data.synthesis:PairsJob:synthesize_pairs", ("dataset_quality",)
    ),
    "synthetic_dataset": StageKind(
        s.SyntheticDataset, "synthesis", f"{_ENGINE}.data.synthesis:SyntheticJob:synthesize_sft", ("dataset_quality",)
    ),
    "sft": StageKind(s.SFT, "training", f"{_ENGINE}.train.sft:SFTJob:train_sft", ("adapter_learned",)),
    "preference": StageKind(
        s.Preference, "training", f"{_ENGINE}.train.preference:PreferenceJob:train_preference", ("adapter_learned",)
    ),
    "grpo": StageKind(s.GRPO, "training", f"{_ENGINE}.train.grpo:GRPOJob:train_grpo", ("reward_hacking",)),
    "merge": StageKind(s.Merge, "merge", f"{_ENGINE}.train.merge:MergeJob:merge_chain"),
    "evaluate": StageKind(
        s.Evaluate, "evaluate", f"{_ENGINE}.evaluate.report:ReportJob:evaluate_report", ("report_not_worse",)
    ),
    "export": StageKind(s.Export, "export", f"{_ENGINE}.export.job:ExportJob:export_stage"),
}

AnyStage = Annotated[tuple(kind.model for kind in KINDS.values()), Field(discriminator="kind")]
_STAGE = TypeAdapter(AnyStage)


def kind_of(stage: s.Stage) -> StageKind:
    return KINDS[stage.kind]


def parse_stage(data: dict[str, Any]) -> s.Stage:
    """A stage's settings from a mapping (a job file's, a YAML item): the model its kind names."""
    return _STAGE.validate_python(data)


def overlay(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """base with top's values put in, nested mappings merged key by key (a profile over a stage, say)."""
    out = dict(base)
    for key, value in top.items():
        out[key] = overlay(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def tunable_fields(model: type[s.Settings]) -> dict[str, Any]:
    """Fields that can change per run (the launchpad, profiles): numbers, switches, choices and nested settings.
    Names, templates, file paths and backends are the pipeline's structure and stay in its YAML."""
    return {
        name: info.annotation
        for name, info in model.model_fields.items()
        if name != "kind" and _tunable(info.annotation)
    }


def _tunable(annotation: Any) -> bool:
    if annotation in (int, float, bool) or get_origin(annotation) is Literal:
        return True
    if isinstance(annotation, type) and issubclass(annotation, s.Settings):
        return True
    options = get_args(annotation) if get_origin(annotation) is not None else ()
    return len(options) == 2 and type(None) in options and {*options} - {type(None)} <= {int, float, bool}
