"""The preference kinds and LoRA dropout: TRL's DPO, KTO and ORPO trainers zero every dropout (disable_dropout),
so these kinds default lora.dropout to 0 and refuse a value above it when the pipeline loads."""

import dataclasses
import warnings
from pathlib import Path

import pytest
import torch

import dragon_dagster
from dragon_dagster.engine.pipeline import PipelineError, load, parse
from dragon_dagster.engine.pipeline.retraining import FeedbackDPO, FeedbackKTO, FeedbackORPO
from dragon_dagster.engine.stages.dpo.settings import DPO
from dragon_dagster.engine.stages.kto.settings import KTO
from dragon_dagster.engine.stages.orpo.settings import ORPO
from dragon_dagster.engine.stages.sft.settings import SFT

BUNDLED = Path(dragon_dagster.__file__).resolve().parent / "defs" / "support" / "defs.yaml"


def pipeline(lora: dict | None, kind: str = "dpo") -> dict:
    dpo = {"name": "prefer", "kind": kind, "dataset": "pairs", **({"lora": lora} if lora is not None else {})}
    return {
        "name": "p",
        "stages": [
            {"name": "chat", "kind": "chat_dataset", "path": "x.csv", "prompt": "p", "response": "r"},
            {"name": "sft", "kind": "sft", "dataset": "chat", "lora": {"dropout": 0.1}},
            {"name": "pairs", "kind": "pairs_dataset", "path": "y.csv", "prompt": "p", "chosen": "c", "rejected": "r"},
            dpo,
        ],
    }


def test_trl_preference_configs_zero_every_dropout_lora_included():
    """What the guard rests on, in TRL 1.16: the three configs default disable_dropout=True, and the trainers'
    disable_dropout_in_model sets every nn.Dropout of the PEFT-wrapped model, LoRA's dropout included, to 0."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl import DPOConfig, KTOConfig
    from trl.trainer.utils import disable_dropout_in_model

    with warnings.catch_warnings():  # importing trl.experimental warns that its APIs may change: the worker's import
        warnings.simplefilter("ignore")
        from trl.experimental.orpo import ORPOConfig

    for config in (DPOConfig, KTOConfig, ORPOConfig):
        assert {f.name: f.default for f in dataclasses.fields(config)}["disable_dropout"] is True, config
    tiny = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)
    model = get_peft_model(
        LlamaForCausalLM(tiny), LoraConfig(r=2, lora_dropout=0.05, target_modules="all-linear", task_type="CAUSAL_LM")
    )
    lora_dropouts = [d for m in model.modules() if hasattr(m, "lora_dropout") for d in m.lora_dropout.values()]
    assert lora_dropouts and all(isinstance(d, torch.nn.Dropout) and d.p == 0.05 for d in lora_dropouts)
    disable_dropout_in_model(model)
    assert all(d.p == 0 for d in lora_dropouts)


@pytest.mark.parametrize("cls", [DPO, KTO, ORPO])
def test_preference_kinds_default_lora_dropout_to_zero(cls):
    kind = cls.model_fields["kind"].annotation.__args__[0]
    assert cls(name="s", kind=kind, dataset="d").lora.dropout == 0.0
    assert cls(name="s", kind=kind, dataset="d", lora={"r": 8}).lora.dropout == 0.0  # a partial lora: still 0
    assert cls(name="s", kind=kind, dataset="d", lora={"dropout": 0}).lora.dropout == 0.0
    assert SFT(name="s", kind="sft", dataset="d").lora.dropout == 0.05  # SFT keeps its dropout: TRL leaves it on


@pytest.mark.parametrize("cls", [DPO, KTO, ORPO])
def test_preference_kinds_refuse_lora_dropout_naming_trl_and_the_fix(cls):
    kind = cls.model_fields["kind"].annotation.__args__[0]
    with pytest.raises(ValueError, match=rf"lora.dropout 0.05 would be silently 0.*{cls.trl_config}.*disable_dropout"):
        cls(name="s", kind=kind, dataset="d", lora={"dropout": 0.05})


def test_a_pipeline_with_lora_dropout_on_a_dpo_stage_is_refused_at_load():
    loaded = parse(pipeline({"r": 8}))
    assert loaded.stages[-1].lora.dropout == 0.0 and loaded.stages[1].lora.dropout == 0.1
    with pytest.raises(PipelineError, match=r"'prefer' \(dpo\): lora.dropout 0.1 .*trl.DPOConfig.*set it to 0"):
        parse(pipeline({"dropout": 0.1}))
    with pytest.raises(PipelineError, match=r"'prefer' \(orpo\): lora.dropout 0.2 .*ORPOConfig"):
        parse(pipeline({"r": 4, "dropout": 0.2}, kind="orpo"))


def test_the_bundled_pipeline_and_feedback_retraining_load_with_no_preference_dropout():
    support = load(BUNDLED)
    preference = [s for s in support.stages if s.kind in ("dpo", "kto", "orpo")]
    assert preference and all(s.lora.dropout == 0.0 for s in preference)
    assert FeedbackDPO().lora.dropout == FeedbackKTO().lora.dropout == 0.0
    assert FeedbackORPO(kind="orpo").lora.dropout == 0.0


def test_a_dpo_stage_trains_with_disable_dropout_stated_and_no_lora_dropout(tiny_model, tmp_path, monkeypatch):
    """The project's own DPO path: TRL's config gets disable_dropout=True, and the trained model has no LoRA
    dropout left above 0 (one step on the tiny model)."""
    from dragon_dagster.engine import catalog
    from dragon_dagster.engine.config.hardware import Hardware, Speed
    from dragon_dagster.engine.config.job import TrainingInputs
    from dragon_dagster.engine.config.reporter import Reporter
    from dragon_dagster.engine.data import tables
    from dragon_dagster.engine.stages.dpo import worker
    from tests.support import ticket_files

    train, _ = ticket_files(tmp_path, n=8)
    pairs = [
        {"prompt": r["prompt"], "chosen": r["completion"], "rejected": [{"role": "assistant", "content": "Wait."}]}
        for r in tables.read_jsonl(train)
    ]
    tables.write_jsonl(tmp_path / "pairs.jsonl", pairs)
    args = {"max_steps": 1, "batch_size": 2, "grad_accum": 1, "logging_steps": 1, "save_steps": 100}
    stage = DPO(name="dpo_adapter", kind="dpo", dataset="pairs", args={**args, "max_seq_len": 96}, n_samples=0)
    (tmp_path / "out").mkdir()
    job = catalog.get("dpo").job_model()(
        settings=stage,
        inputs=TrainingInputs(
            model=str(tiny_model), train_file=str(tmp_path / "pairs.jsonl"), checkpoint_dir=str(tmp_path / "ckpt")
        ),
        output_dir=str(tmp_path / "out"),
        hardware=Hardware(device="cpu"),
        speed=Speed(),
    )
    built = []
    trainer = worker.DPOMethod.trainer
    monkeypatch.setattr(worker.DPOMethod, "trainer", lambda self, *a: built.append(trainer(self, *a)) or built[-1])
    assert worker.train_dpo(job, Reporter()) is not None
    assert built[0].args.disable_dropout is True
    dropouts = [d for m in built[0].model.modules() if hasattr(m, "lora_dropout") for d in m.lora_dropout.values()]
    assert dropouts and all(getattr(d, "p", 0) == 0 for d in dropouts)
