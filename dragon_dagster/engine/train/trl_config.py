"""A training stage's settings model as TRL's config object: what every kind's `to_trl_config` builds on.

A setting reaches TRL by its field: every field of the stage's kind (and of its `args`) whose name is an argument
of the kind's TRL config class is passed under that name, so adding a TRL option to a kind is one field in its
model. Where our name differs from TRL's, the kind's mapping (`names`, `{path of our field: TRL's name}`) says
so in one line; a path mapped to None is held back (a field TRL names alike but that means something else here).
The fields every stage has (its name, dataset, adapter shape, sample counts) are ours and reach TRL only when a
kind's mapping names them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel

from ..config.hardware import Hardware, Speed
from ..config.job import Job, TrainingInputs
from ..models import pick_device, pick_dtype
from . import distributed, held_out
from .stage import TrainerStage

# Our trainer arguments (config/training.py TrainArgs) that transformers names otherwise.
ARGS_NAMES: dict[str, str | None] = {
    "args.epochs": "num_train_epochs",
    "args.batch_size": "per_device_train_batch_size",
    "args.grad_accum": "gradient_accumulation_steps",
    "args.warmup_ratio": "warmup_steps",  # transformers 5 reads a value below 1 as a share of the steps
    # transformers 5 renamed it (the old name warns and is mirrored); our setting keeps the familiar name
    "args.gradient_checkpointing": "activation_checkpointing",
    "args.max_seq_len": None,  # a kind whose config truncates maps it (max_length); the others have no such option
    # held-out evaluation while training: held_out.trainer_arguments turns these into the trainer's arguments
    "args.eval_every": None,
    "args.max_eval_rows": None,
    "args.early_stopping": None,
    "args.keep": None,
}

C = TypeVar("C")


@dataclass(frozen=True)
class TrainerRun:
    """What a TRL config needs besides the stage's settings: where it runs and how (not settings of the stage).

    compiled_here: the stage compiled its model itself (lm_head.use_chunked), so the trainer must not again.
    workers: data-parallel ranks; args.batch_size is the global batch, so each rank takes its share."""

    hardware: Hardware
    checkpoint_dir: str
    speed: Speed | None = None
    compiled_here: bool = False
    workers: int = 1

    @classmethod
    def of(cls, job: Job[Any, TrainingInputs], speed: Speed | None = None, **how: Any) -> TrainerRun:
        """The run of a training job; speed: the job's, resolved for the device (trainer.prepare) when given."""
        return cls(job.hardware, job.inputs.checkpoint_dir, speed if speed is not None else job.speed, **how)

    def arguments(self) -> dict[str, Any]:
        """The arguments every trainer gets from where it runs: output, precision, logging and saving policy."""
        return dict(
            torch_compile=bool(self.speed and self.speed.torch_compile and not self.compiled_here),
            output_dir=self.checkpoint_dir,
            logging_first_step=True,
            save_strategy="steps",
            save_total_limit=2,
            report_to="none",
            logging_nan_inf_filter=False,  # the progress callback stops on a NaN loss: it must see it
            **trainer_precision(self.hardware),
        )


def trainer_precision(hardware: Hardware) -> dict[str, bool]:
    """bf16/fp16 flags for the trainer; TRL defaults to bf16 even on a CPU, which we do not want there."""
    import torch

    device = pick_device(hardware)
    dtype = pick_dtype(hardware, device)
    return {
        "use_cpu": device == "cpu",
        "bf16": dtype == torch.bfloat16 and device != "cpu",
        "fp16": dtype == torch.float16 and device != "cpu",
    }


def config_fields(config_class: type) -> set[str]:
    """The arguments a TRL config class (a dataclass, as every TrainingArguments is) takes."""
    return {f.name for f in dataclasses.fields(config_class) if f.init}


def settings_arguments(
    settings: TrainerStage, config_class: type, names: Mapping[str, str | None] | None = None
) -> dict[str, Any]:
    """The stage's settings as the config class's arguments: each field TRL has by name (or by the name `names`
    gives its path), values as the model holds them."""
    names = {**ARGS_NAMES, **(names or {})}
    accepted = config_fields(config_class)
    ours = set(TrainerStage.model_fields)  # every stage has them; a kind's mapping passes the ones TRL reads
    found: dict[str, Any] = {}
    for path, value in _fields(settings.args, "args."):
        trl_name = names.get(path, path.removeprefix("args."))
        if trl_name in accepted:
            found[trl_name] = value
    for path, value in _fields(settings, ""):
        trl_name = names.get(path, None if path in ours else path)
        if trl_name in accepted:
            found[trl_name] = value
    for path in names:
        if names[path] is not None and names[path] not in accepted:
            raise TypeError(
                f"{type(settings).__name__}: {path} is mapped to {names[path]!r}, which "
                f"{config_class.__name__} does not take"
            )
    return found


def _fields(model: BaseModel, prefix: str):
    for name in type(model).model_fields:
        if prefix or name != "args":
            yield prefix + name, getattr(model, name)


def trl_config(
    config_class: type[C],
    settings: TrainerStage,
    run: TrainerRun,
    names: Mapping[str, str | None] | None = None,
    **given: Any,
) -> C:
    """config_class built from the stage's settings (settings_arguments) and where it runs (run); given: what the
    kind sets from its data or its tools rather than from a setting, and over any of these."""
    arguments = {
        **run.arguments(),
        **settings_arguments(settings, config_class, names),
        **held_out.trainer_arguments(settings.args),
    }
    arguments["max_steps"] = settings.args.max_steps or -1  # TrainingArguments' "no limit"
    if "per_device_train_batch_size" not in given:  # a kind whose batch counts something else sets its own
        arguments["per_device_train_batch_size"] = distributed.split_batch(settings.args.batch_size, run.workers)
    return config_class(**{**arguments, **given})
