"""DPO's loss types (stages/dpo/settings.py) on the chunked preference head, against TRL's own fused head.

Each loss type is set on the stage's settings and reaches DPOTrainer through DPOConfig by its name
(stages/dpo/trl_config.py). Two trainers are built on the tiny model with the same LoRA weights: TRL's (its fused
head) and one whose head is the project's chunked one (use_chunked_head, paired, with unpad: a pair's common prompt
runs once). Both get the same collated batch, and compute_loss must give the same loss and gradients.
"""

from __future__ import annotations

import re

import pytest
import torch
from pydantic import ValidationError

from dragon_dagster.engine.stages.dpo.settings import DPO, DPOLoss
from dragon_dagster.engine.train.trl_config import settings_arguments

LOSSES = {name: {"loss_type": name} for name in DPOLoss.__args__}
LOSSES["exo_pair"] = {"loss_type": "exo_pair", "label_smoothing": 1e-3}  # EXO needs its ε above 0
VARIANTS = {
    **LOSSES,
    "robust_noisy": {"loss_type": "robust", "label_smoothing": 0.1},
    "aot_smoothed": {"loss_type": "aot", "label_smoothing": 0.2},
    "discopop_tau": {"loss_type": "discopop", "discopop_tau": 0.5},
    "rpo": {"loss_type": ["sigmoid", "sft"]},
    "mpo": {"loss_type": ["sigmoid", "bco_pair", "sft"], "loss_weights": [0.8, 0.2, 1.0]},
}
PAIRS = [  # two pairs share a prompt (they run it once with unpad), replies of different lengths
    ("My thermostat shows E4.", "Reset it by holding the power button for ten seconds.", "No idea."),
    ("My thermostat shows E4.", "E4 means the sensor is loose; reseat it.", "Buy a new one, honestly, it is old."),
    ("The door lock beeps twice.", "Two beeps mean a low battery: replace the four AA cells.", "Ignore it."),
    ("How do I pair the hub?", "Open the app, tap Add device, and hold the hub's button.", "Call us."),
]


def loss_config(settings: DPO) -> dict:
    """The loss fields as the stage passes them to DPOConfig (by their names)."""
    from trl import DPOConfig

    own = ("loss_type", "loss_weights", "label_smoothing", "discopop_tau")
    return {k: v for k, v in settings_arguments(settings, DPOConfig).items() if k in own}


def stage(**variant) -> DPO:
    return DPO(name="dpo_adapter", kind="dpo", dataset="pairs", **variant)


@pytest.fixture(scope="module")
def build(tiny_model, tmp_path_factory):
    """build(variant, chunked): a DPOTrainer for the stage settings variant on a fresh copy of the tiny model, with
    LoRA weights that are the same for every call (B not zero: the policy differs from its reference, the adapter
    switched off), as the dpo worker builds it (no reference copy, dropout off)."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM
    from trl import DPOConfig, DPOTrainer

    from dragon_dagster.engine import models
    from dragon_dagster.engine.train import unpadded
    from dragon_dagster.engine.train.preference_head import use_chunked_head

    out = tmp_path_factory.mktemp("dpo_variants")
    tokenizer = models.load_tokenizer(str(tiny_model))
    rows = [
        {
            "prompt": [{"role": "user", "content": prompt}],
            "chosen": [{"role": "assistant", "content": chosen}],
            "rejected": [{"role": "assistant", "content": rejected}],
        }
        for prompt, chosen, rejected in PAIRS
    ]

    def make(variant: dict, chunked: bool):
        model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
        config = DPOConfig(
            output_dir=str(out),
            per_device_train_batch_size=len(PAIRS),
            max_length=128,
            beta=0.1,
            use_cpu=True,
            bf16=False,  # as common_args sets it on a CPU
            report_to=[],
            disable_dropout=True,
            **loss_config(stage(**variant)),
        )
        trainer = DPOTrainer(
            model=model,
            ref_model=None,
            args=config,
            train_dataset=Dataset.from_list(rows),
            processing_class=tokenizer,
            peft_config=LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0),
        )
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():  # as if trained a little: the reference (the adapter off) is the model before
            for name, param in trainer.model.named_parameters():
                if "lora_" in name:
                    param.copy_(torch.randn(param.shape, generator=g) * 0.2)
        if chunked:
            unpadded.use(trainer.model)
            use_chunked_head(trainer.model.get_base_model(), unpad=True, paired=True)
        trainer.model.train()
        return trainer

    return make


@pytest.fixture(scope="module")
def batch(build) -> dict:
    """The four pairs collated as DPOTrainer feeds them: [chosen; rejected] rows and their completion mask."""
    trainer = build({}, chunked=False)
    return trainer.data_collator([trainer.train_dataset[i] for i in range(len(PAIRS))])


def loss_and_grads(trainer, batch: dict) -> tuple[float, dict]:
    trainer.model.zero_grad()
    loss = trainer.compute_loss(trainer.model, dict(batch))
    loss.backward()
    grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    return loss.item(), grads


@pytest.fixture(scope="module")
def outcome(build, batch):
    """outcome(name): (TRL's loss and gradients, the chunked head's) for VARIANTS[name] on the batch, once."""
    done: dict[str, tuple] = {}

    def run(name: str):
        if name not in done:
            done[name] = tuple(loss_and_grads(build(VARIANTS[name], chunked), batch) for chunked in (False, True))
        return done[name]

    return run


@pytest.mark.parametrize("name", list(VARIANTS))
def test_each_loss_type_gives_trls_loss_and_gradients_on_the_chunked_head(name, outcome):
    (loss, grads), (ours, our_grads) = outcome(name)
    assert ours == pytest.approx(loss, rel=1e-5, abs=1e-6)
    assert grads.keys() == our_grads.keys() and len(grads) == 28  # 14 adapted layers, A and B
    scale = max(g.abs().max().item() for g in grads.values())
    assert scale > 0
    for key, grad in grads.items():
        assert torch.allclose(our_grads[key], grad, rtol=1e-3, atol=1e-4 * scale), key


def test_each_loss_type_gives_its_own_loss(outcome):
    """So the setting reaches TRL's loss: each loss type's formula gives another number on the batch, and the
    parameters move the loss they belong to. Two equal sigmoid by their formulas here: robust with no label
    flipped (label_smoothing 0), and aot, which pairs the sorted policy margins with the sorted reference margins,
    when the batch's pairs rank alike under both (the adapter moves them less than the pairs differ)."""
    same_as_sigmoid = ("robust", "aot")
    for name in same_as_sigmoid:
        assert outcome(name)[0][0] == pytest.approx(outcome("sigmoid")[0][0], rel=1e-6), name
    losses = {name: round(outcome(name)[0][0], 6) for name in LOSSES if name not in same_as_sigmoid}
    assert len(set(losses.values())) == len(losses), losses
    assert outcome("robust_noisy")[0][0] != pytest.approx(outcome("robust")[0][0], rel=1e-4)
    assert outcome("aot_smoothed")[0][0] != pytest.approx(outcome("aot")[0][0], rel=1e-4)
    assert outcome("discopop_tau")[0][0] != pytest.approx(outcome("discopop")[0][0], rel=1e-4)
    assert outcome("rpo")[0][0] == pytest.approx(outcome("sigmoid")[0][0] + outcome("sft")[0][0], rel=1e-5)
    mpo = 0.8 * outcome("sigmoid")[0][0] + 0.2 * outcome("bco_pair")[0][0] + outcome("sft")[0][0]
    assert outcome("mpo")[0][0] == pytest.approx(mpo, rel=1e-5)


# ------------------------------------------------------------------------------------------- settings


def test_the_settings_reach_dpo_config_with_trls_defaults():
    from dataclasses import fields

    from trl import DPOConfig

    defaults = {f.name: f.default_factory() if callable(f.default_factory) else f.default for f in fields(DPOConfig)}
    config = loss_config(stage())
    assert config == {name: defaults[name] for name in config}
    chosen = {"loss_type": ["robust", "sft"], "loss_weights": [1.0, 0.5], "label_smoothing": 0.1}
    made = DPOConfig(output_dir="unused", use_cpu=True, bf16=False, **loss_config(stage(**chosen)))
    assert {name: getattr(made, name) for name in chosen} == chosen
    assert loss_config(stage(loss_type="ipo"))["loss_type"] == ["ipo"]  # one loss type needs no list


def test_the_loss_types_are_the_ones_trl_documents():
    from dataclasses import fields

    from trl import DPOConfig

    help_text = next(f for f in fields(DPOConfig) if f.name == "loss_type").metadata["help"]
    documented = re.search(r"Possible values are: (.*?)\. ", help_text).group(1)
    assert set(re.findall(r"'(\w+)'", documented)) == set(DPOLoss.__args__)


def test_the_worker_passes_the_loss_to_dpo_config(tiny_model, tmp_path, monkeypatch):
    import trl

    from dragon_dagster.engine import catalog
    from dragon_dagster.engine.config.hardware import Hardware
    from dragon_dagster.engine.config.job import TrainingInputs
    from dragon_dagster.engine.config.reporter import Reporter
    from dragon_dagster.engine.data import tables
    from dragon_dagster.engine.stages.dpo.worker import train_dpo

    pair = {
        "prompt": [{"role": "user", "content": "hi"}],
        "chosen": [{"role": "assistant", "content": "Hello!"}],
        "rejected": [{"role": "assistant", "content": "What."}],
    }
    tables.write_jsonl(tmp_path / "pairs.jsonl", [pair] * 2)
    settings = stage(loss_type=["ipo", "sft"], loss_weights=[1.0, 0.3])
    job = catalog.get("dpo").job_model()(
        settings=settings,
        inputs=TrainingInputs(
            model=str(tiny_model), train_file=str(tmp_path / "pairs.jsonl"), checkpoint_dir=str(tmp_path / "ckpt")
        ),
        output_dir=str(tmp_path),
        hardware=Hardware(device="cpu"),
    )
    seen = {}

    class Stop(Exception):
        pass

    class Config(trl.DPOConfig):  # TRL's class, stopped once built: what it was given is what the worker passes
        def __post_init__(self):
            seen.update(vars(self))
            raise Stop

    monkeypatch.setattr(trl, "DPOConfig", Config)
    with pytest.raises(Stop):
        train_dpo(job, Reporter())
    assert {k: seen[k] for k in loss_config(settings)} == loss_config(settings)
    assert seen["loss_type"] == ["ipo", "sft"] and seen["loss_weights"] == [1.0, 0.3] and seen["beta"] == 0.1


REFUSED = [
    ({"loss_type": "exo_pair"}, r"dpo stage 'dpo_adapter': loss_type exo_pair needs label_smoothing above 0"),
    ({"label_smoothing": 0.1}, r"dpo stage 'dpo_adapter': label_smoothing has no effect with loss_type \['sigmoid'\]"),
    ({"loss_type": "ipo", "discopop_tau": 0.1}, r"dpo stage 'dpo_adapter': discopop_tau has no effect"),
    ({"loss_type": ["sigmoid", "sft"], "loss_weights": [1.0]}, r"1 loss_weights for 2 loss types"),
    ({"loss_type": ["sigmoid", "sigmoid"]}, r"sigmoid named twice"),
    ({"loss_type": []}, r"name at least one loss type"),
    ({"loss_type": "dpo"}, r"Input should be 'sigmoid', 'hinge'"),
    ({"loss_type": "robust", "label_smoothing": 0.5}, r"label_smoothing\n.*less than 0.5"),
    ({"loss_type": ["sigmoid", "sft"], "loss_weights": [1.0, 0.0]}, r"greater than 0"),
]


@pytest.mark.parametrize(("variant", "message"), REFUSED)
def test_loss_settings_that_cannot_work_are_refused(variant, message):
    with pytest.raises(ValidationError, match=message):
        stage(**variant)


def test_one_loss_type_or_a_list_validates_against_the_json_schema():
    import jsonschema

    validator = jsonschema.Draft202012Validator(DPO.model_json_schema())
    base = {"name": "d", "kind": "dpo", "dataset": "p"}
    assert not list(validator.iter_errors({**base, "loss_type": "ipo"}))
    assert not list(validator.iter_errors({**base, "loss_type": ["sigmoid", "sft"], "loss_weights": [1, 0.5]}))
    assert list(validator.iter_errors({**base, "loss_type": "dpo"}))
    assert list(validator.iter_errors({**base, "loss_type": []}))
