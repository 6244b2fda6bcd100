"""A training stage's settings reach TRL's config through one typed object: the kind's model, from the YAML through
the job and job.json to the kind's to_trl_config (stages/<kind>/trl_config.py). Config objects only, no training."""

import typing

import pytest
import yaml
from pydantic import BaseModel, Field

from dragon_dagster.engine import catalog
from dragon_dagster.engine.config.hardware import Hardware, Speed
from dragon_dagster.engine.config.job import TrainingInputs, absolute_paths, relative_paths
from dragon_dagster.engine.runtime.execution import load_job
from dragon_dagster.engine.runtime.worker import read_job
from dragon_dagster.engine.stages.sft.settings import SFT
from dragon_dagster.engine.stages.sft.trl_config import NAMES, to_trl_config
from dragon_dagster.engine.train.trl_config import TrainerRun, trl_config

# Each training kind's YAML with one of its own settings set, and where TRL's config shows it. learning_rate is
# written as YAML 1.1 reads `3.5e-4`, a string the model reads as a number.
KIND_SETTING = {
    "sft": ("train_on: all_assistant_turns", "assistant_only_loss", True),
    "dpo": ("loss_type: [ipo, sft]", "loss_type", ["ipo", "sft"]),
    "orpo": ("beta: 0.3", "beta", 0.3),
    "kto": ("desirable_weight: 0.7", "desirable_weight", 0.7),
    "reward_model": ("center_rewards: 0.01", "center_rewards_coefficient", 0.01),
    "grpo": ("group_size: 3\nrewards: [{type: numeric}]\nloss_type: bnpo", "num_generations", 3),
    "rloo": ("group_size: 2\nrewards: [{type: numeric}]\nnormalize_advantages: true", "normalize_advantages", True),
    "distill": ("teacher: {model: tiny}\ntemperature: 0.5", "temperature", 0.5),
}


def stage_yaml(kind: str) -> str:
    own, _, _ = KIND_SETTING[kind]
    return f"name: {kind}_stage\nkind: {kind}\ndataset: rows\nargs: {{learning_rate: 3.5e-4, batch_size: 2}}\n{own}\n"


def no_dicts(value, where: str) -> None:
    """Every setting is held by a model of its own, all the way down (a Backend may be a mapping by design)."""
    if isinstance(value, BaseModel):
        for name in type(value).model_fields:
            no_dicts(getattr(value, name), f"{where}.{name}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            no_dicts(item, f"{where}[{i}]")
    else:
        assert not isinstance(value, dict), f"{where} is carried as a dict"


def test_every_training_kind_has_its_trl_config_function():
    training = {name for name, kind in catalog.KINDS.items() if kind.role == "training"}
    assert training == set(KIND_SETTING)
    assert {name for name, kind in catalog.KINDS.items() if kind.trl_config} == training


@pytest.mark.parametrize("kind_name", sorted(KIND_SETTING))
def test_a_setting_travels_from_the_yaml_through_job_json_to_trls_config(kind_name, tmp_path):
    kind = catalog.get(kind_name)
    stage = catalog.parse_stage(yaml.safe_load(stage_yaml(kind_name)))
    assert type(stage) is kind.settings
    inputs = TrainingInputs(
        model="tiny", train_file=str(tmp_path / "train.jsonl"), checkpoint_dir=str(tmp_path / "ckpt")
    )
    job = kind.job_model()(
        settings=stage, inputs=inputs, output_dir=str(tmp_path), hardware=Hardware(device="cpu"), speed=Speed()
    )
    (tmp_path / "job.json").write_text(relative_paths(job, tmp_path).model_dump_json(indent=2))  # as the resource
    mapping, _ = read_job(str(tmp_path / "job.json"))
    parsed, _ = load_job(mapping)
    parsed = absolute_paths(parsed, tmp_path)
    assert type(parsed.settings) is kind.settings and parsed.settings == stage
    no_dicts(parsed.settings, kind_name)

    config = kind.load_trl_config()(parsed.settings, TrainerRun.of(parsed, parsed.speed.resolve("cpu")))

    _, field, value = KIND_SETTING[kind_name]
    assert type(config).__module__.startswith("trl.")
    assert getattr(config, field) == value
    assert config.learning_rate == 3.5e-4
    assert config.output_dir == str(tmp_path / "ckpt") and config.use_cpu and not config.bf16


def test_to_trl_config_takes_the_kinds_model_not_a_mapping():
    for name, kind in catalog.KINDS.items():
        if kind.trl_config:
            function = kind.load_trl_config()
            hints = typing.get_type_hints(function)
            assert hints["settings"] is kind.settings, name
            assert hints["run"] is TrainerRun, name


class SmoothedSFT(SFT):
    """A kind given one more TRL option: its field is the whole change."""

    label_smoothing_factor: float = Field(0.0, ge=0, description="Label smoothing of the loss.")


def run(tmp_path) -> TrainerRun:
    return TrainerRun(Hardware(device="cpu"), str(tmp_path), Speed().resolve("cpu"))


def test_a_field_added_to_a_kind_reaches_trls_config(tmp_path):
    settings = SmoothedSFT(name="s", kind="sft", dataset="rows", label_smoothing_factor=0.1)
    assert to_trl_config(settings, run(tmp_path)).label_smoothing_factor == 0.1
    assert to_trl_config(SmoothedSFT(name="s", kind="sft", dataset="rows"), run(tmp_path)).label_smoothing_factor == 0


@pytest.mark.parametrize("kind_name", sorted(KIND_SETTING))
def test_the_optimizer_schedule_and_clipping_reach_every_kinds_trl_config(kind_name, tmp_path):
    kind = catalog.get(kind_name)
    stage = catalog.parse_stage(yaml.safe_load(stage_yaml(kind_name)))
    default = kind.load_trl_config()(stage, run(tmp_path))
    # our defaults are transformers' own: a pipeline that sets none of them trains as before
    assert (default.optim, default.lr_scheduler_type, default.max_grad_norm) == ("adamw_torch_fused", "linear", 1.0)
    args = {**stage.args.model_dump(), "optim": "adafactor", "lr_scheduler_type": "cosine", "max_grad_norm": 0.5}
    config = kind.load_trl_config()(stage.model_copy(update={"args": type(stage.args)(**args)}), run(tmp_path))
    assert (config.optim, config.lr_scheduler_type, config.max_grad_norm) == ("adafactor", "cosine", 0.5)


def test_every_optimizer_and_schedule_offered_is_one_transformers_knows():
    from transformers.trainer_utils import SchedulerType
    from transformers.training_args import OptimizerNames

    from dragon_dagster.engine.config.training import Optimizer, Schedule

    assert set(typing.get_args(Optimizer)) <= {o.value for o in OptimizerNames}
    assert set(typing.get_args(Schedule)) <= {s.value for s in SchedulerType}
    with pytest.raises(ValueError, match="adamw_8bit"):  # the error names the value and what is offered
        catalog.parse_stage({"name": "s", "kind": "sft", "dataset": "rows", "args": {"optim": "adamw_8bit"}})


def test_neftune_reaches_sfts_config_and_nothing_else_takes_it(tmp_path):
    assert (
        to_trl_config(
            SFT(name="s", kind="sft", dataset="rows", neftune_noise_alpha=5), run(tmp_path)
        ).neftune_noise_alpha
        == 5
    )
    assert to_trl_config(SFT(name="s", kind="sft", dataset="rows"), run(tmp_path)).neftune_noise_alpha is None
    with pytest.raises(ValueError, match="neftune_noise_alpha"):
        catalog.parse_stage({"name": "d", "kind": "dpo", "dataset": "rows", "neftune_noise_alpha": 5})


def test_a_field_trl_names_otherwise_reaches_it_through_one_line_of_the_mapping(tmp_path):
    from trl import SFTConfig

    class Noisy(SFT):
        noise: float = Field(3.0, gt=0)

    settings = Noisy(name="s", kind="sft", dataset="rows", args={"max_seq_len": 77})
    assert trl_config(SFTConfig, settings, run(tmp_path), NAMES).neftune_noise_alpha is None  # not TRL's name
    config = trl_config(SFTConfig, settings, run(tmp_path), {**NAMES, "noise": "neftune_noise_alpha"})
    assert config.neftune_noise_alpha == 3.0 and config.max_length == 77


def test_a_mapping_to_an_argument_trl_lacks_is_refused_by_name(tmp_path):
    from trl import SFTConfig

    settings = SFT(name="s", kind="sft", dataset="rows")
    with pytest.raises(TypeError, match="n_samples is mapped to 'num_samples', which SFTConfig does not take"):
        trl_config(SFTConfig, settings, run(tmp_path), {"n_samples": "num_samples"})


def test_the_shared_trainer_arguments(tmp_path):
    settings = SFT(
        name="s",
        kind="sft",
        dataset="rows",
        args={"epochs": 2, "batch_size": 8, "grad_accum": 3, "warmup_ratio": 0.1, "gradient_checkpointing": True},
    )
    config = to_trl_config(settings, TrainerRun(Hardware(device="cpu"), str(tmp_path), workers=2))
    assert config.num_train_epochs == 2 and config.max_steps == -1
    assert config.per_device_train_batch_size == 4  # the global batch split over two workers
    assert config.gradient_accumulation_steps == 3 and config.warmup_steps == 0.1
    assert config.activation_checkpointing and config.save_total_limit == 2 and not config.logging_nan_inf_filter
    assert config.max_length == 1024  # args.max_seq_len, by the sft mapping
