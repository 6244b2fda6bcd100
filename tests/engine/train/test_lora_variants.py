"""PEFT's LoRA variants as fields of `lora:` (config/training.py Lora, train/variants.py): each reaches the
LoraConfig or the optimizer the trainer gets and has its effect; the fast paths stay PEFT's values for DoRA and
rsLoRA; a PiSSA adapter is saved as a plain one on the untouched base; what cannot work is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dragon_dagster.engine.config.reporter import Reporter
from dragon_dagster.engine.config.training import Lora
from dragon_dagster.engine.models import load_model, load_tokenizer
from dragon_dagster.engine.train.trainer import TrainingError, lora_config
from tests.engine.train.fast_paths import assert_same_grads, collate, examples, lora_grads
from tests.support import SMALL_DECODER, sft_job, ticket_files


def with_lora(job, **lora):
    return job.model_copy(update={"settings": job.settings.model_copy(update={"lora": Lora(r=4, alpha=8, **lora)})})


def sft_trainer(tmp_path: Path, tiny_model: Path, steps: int = 3, warmup_ratio: float = 0.03, **lora):
    """An SFT trainer built and run as the sft worker builds and runs it (prepare, lora_config, run_trainer), kept
    so the test can read its model and optimizer; and the job."""
    from dragon_dagster.engine.stages.sft import turns
    from dragon_dagster.engine.stages.sft.trainer import resumable_trainer
    from dragon_dagster.engine.stages.sft.trl_config import to_trl_config
    from dragon_dagster.engine.train.trainer import prepare, progress_callback, run_trainer
    from dragon_dagster.engine.train.trl_config import TrainerRun

    tmp_path.mkdir(parents=True, exist_ok=True)
    train, held = ticket_files(tmp_path, n=16)
    job = with_lora(
        sft_job(tmp_path, tiny_model, train, held, max_steps=steps, save_steps=100, warmup_ratio=warmup_ratio), **lora
    )
    p = prepare(job, template=lambda tokenizer, rows: turns.prepare_template(tokenizer, rows, "final_turn"))
    callback = progress_callback(Reporter(), Path(job.output_dir))
    trainer = resumable_trainer()(
        model=p.model,
        args=to_trl_config(job.settings, TrainerRun.of(job, p.speed)),
        train_dataset=turns.training_dataset(p.train_rows, "final_turn"),
        processing_class=p.tokenizer,
        peft_config=lora_config(p.lora),
        callbacks=[callback],
    )
    run_trainer(trainer, callback, job, Reporter())
    return trainer, job


def test_each_field_reaches_peft_lora_config():
    config = lora_config(Lora(use_dora=True, use_rslora=True))
    assert config.use_dora and config.use_rslora and config.init_lora_weights is True  # gaussian: PEFT's default
    assert lora_config(Lora(init="pissa")).init_lora_weights == "pissa_niter_4"  # randomized SVD: seconds on a CPU
    assert lora_config(Lora(init="olora")).init_lora_weights == "olora"
    plain = lora_config(Lora())
    assert not plain.use_dora and not plain.use_rslora


def test_refusals_name_the_problem():
    from pydantic import ValidationError

    from dragon_dagster.engine import catalog

    with pytest.raises(ValidationError, match="EVA initialises the adapter from the activations"):
        Lora(init="eva")
    with pytest.raises(ValidationError, match="no place for DoRA's magnitudes"):
        Lora(init="pissa", use_dora=True)
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        Lora(loraplus_lr_ratio=0.5)
    for kind in ("dpo", "kto"):  # their reference is the adapter-off model, which PiSSA/OLoRA change
        with pytest.raises(ValidationError, match="reference model is the policy with its adapter off"):
            catalog.get(kind).settings(name="p", kind=kind, dataset="pairs", lora={"init": "pissa"})
    catalog.get("orpo").settings(name="p", kind="orpo", dataset="pairs", lora={"init": "pissa"})  # no reference
    grpo = {"name": "g", "kind": "grpo", "dataset": "prompts", "rewards": [{"type": "numeric"}]}
    with pytest.raises(ValidationError, match="KL penalty"):
        catalog.get("grpo").settings(**grpo, lora={"init": "olora"})
    catalog.get("grpo").settings(**grpo, beta=0, lora={"init": "olora"})  # no KL, no reference
    with pytest.raises(ValidationError, match="score head"):
        catalog.get("reward_model").settings(name="r", kind="reward_model", dataset="pairs", lora={"init": "olora"})


def test_loftq_is_refused_on_a_cpu_before_the_model_loads(tiny_model, tmp_path):
    from dragon_dagster.engine.stages.sft.worker import train_sft

    train, held = ticket_files(tmp_path, n=8)
    job = with_lora(sft_job(tmp_path, tiny_model, train, held), init="loftq")
    with pytest.raises(TrainingError, match="loftq needs a CUDA GPU and this job runs on cpu"):
        train_sft(job, Reporter())


def peft_model(**lora):
    from peft import get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = get_peft_model(LlamaForCausalLM(LlamaConfig(**SMALL_DECODER, vocab_size=300)), lora_config(Lora(**lora)))
    for name, param in model.named_parameters():  # B starts at zero; make the adapter matter
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.1)
    return model


@pytest.mark.parametrize("variant", [{"use_dora": True}, {"use_rslora": True}])
def test_fast_paths_give_peft_values_for_dora_and_rslora(variant):
    """The chunked head over the unpadded backbone, with accumulated products where they apply, against PEFT's own
    forward and transformers' loss: same loss, same gradients (DoRA's magnitudes included)."""
    from dragon_dagster.engine.train import lm_head, unpadded
    from dragon_dagster.engine.train.lora_products import use_lora_products

    model = peft_model(r=4, alpha=8, dropout=0.0, **variant)
    batch = collate(examples(), padding_free=False)
    expected_loss = model(**batch).loss
    expected_loss.backward()
    expected = lora_grads(model)
    assert any("magnitude" in name for name in expected) == bool(variant.get("use_dora"))
    unpadded.use(model)
    patched = use_lora_products(model)
    assert patched == 14  # DoRA's layers are patched too, but each call falls back to PEFT's forward (applies())
    loss, _ = lm_head.causal_lm_loss(model, batch, batch["labels"], unpad=True)
    assert loss.item() == pytest.approx(expected_loss.item(), rel=1e-5)
    loss.backward()
    assert_same_grads(lora_grads(model), expected)


def test_dora_trains_records_peft_products_and_reloads_with_the_same_greedy_replies(tiny_model, tmp_path):
    from dragon_dagster.engine.config.hardware import Hardware
    from dragon_dagster.engine.infer.generation import generate
    from dragon_dagster.engine.stages.sft.worker import train_sft

    train, held = ticket_files(tmp_path, n=16)
    job = with_lora(sft_job(tmp_path, tiny_model, train, held, max_steps=3, save_steps=100), use_dora=True)
    result = train_sft(job, Reporter())
    adapter = tmp_path / "out" / "adapter"
    assert json.loads((adapter / "adapter_config.json").read_text())["use_dora"] is True
    assert result.speed["lora_product"] == "peft (DoRA)" and "accumulated_lora_layers" not in result.speed
    samples = [json.loads(line) for line in (tmp_path / "out" / "samples.jsonl").read_text().splitlines()]
    rows = [json.loads(line) for line in (held.read_text() or train.read_text()).splitlines()][: len(samples)]
    # folded into the base as a later stage, the merge and chat load it
    merged = load_model(str(tiny_model), Hardware(device="cpu"), adapters=[str(adapter)])
    replies = generate(merged, load_tokenizer(str(tiny_model)), [r["prompt"] for r in rows], max_new_tokens=4)
    assert replies == [s["generated"] for s in samples]


def test_a_pissa_adapter_is_saved_as_a_plain_lora_on_the_untouched_base(tiny_model, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    trainer, job = sft_trainer(tmp_path, tiny_model, init="pissa")
    adapter = Path(job.output_dir) / "adapter"
    saved = json.loads((adapter / "adapter_config.json").read_text())
    assert saved["init_lora_weights"] is True and saved["r"] == 8  # [A | A0], [B | -B0]: a plain LoRA of rank 2r
    ids = torch.randint(0, 300, (2, 9), generator=torch.Generator().manual_seed(1))
    trained = trainer.model.eval()
    with torch.no_grad():
        expected = trained(input_ids=ids).logits
        with trained.disable_adapter():  # the residual base PiSSA trained on is not the base
            assert not torch.allclose(trained(input_ids=ids).logits, expected, atol=1e-3)
        base = AutoModelForCausalLM.from_pretrained(str(tiny_model))
        reloaded = PeftModel.from_pretrained(base, str(adapter)).eval()
        assert torch.allclose(reloaded(input_ids=ids).logits, expected, atol=1e-4)


def test_as_started_is_the_starting_model_under_a_base_changing_init():
    from peft import get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from dragon_dagster.engine.train.variants import as_started

    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(**SMALL_DECODER, vocab_size=300)).eval()
    ids = torch.randint(0, 300, (2, 7), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        start = base(input_ids=ids).logits
        lora = Lora(r=4, alpha=8, dropout=0.0, init="olora")
        model = get_peft_model(base, lora_config(lora)).eval()
        with as_started(model, lora):
            assert torch.allclose(model(input_ids=ids).logits, start, atol=1e-4)
        with model.disable_adapter():
            assert not torch.allclose(model(input_ids=ids).logits, start, atol=1e-3)


def test_loraplus_gives_the_b_matrices_ratio_times_the_learning_rate(tiny_model, tmp_path):
    ratio = 16.0
    trainer, job = sft_trainer(tmp_path / "plus", tiny_model, 2, 0.0, loraplus_lr_ratio=ratio)
    lr = job.settings.args.learning_rate
    groups = {id(p): g for g in trainer.optimizer.param_groups for p in g["params"]}
    named = dict(trainer.model.named_parameters())
    a = [groups[id(p)]["initial_lr"] for n, p in named.items() if "lora_A" in n]
    b = [groups[id(p)]["initial_lr"] for n, p in named.items() if "lora_B" in n]
    assert a and set(a) == {lr} and b == [pytest.approx(ratio * lr)] * len(a)
    plain, _ = sft_trainer(tmp_path / "plain", tiny_model, 2, 0.0)

    def b_size(model) -> float:
        return sum(p.abs().sum().item() for n, p in model.named_parameters() if "lora_B" in n)

    # B starts at zero: Adam moves each weight by about its learning rate a step, so ratio times as far
    assert b_size(trainer.model) > 4 * b_size(plain.model)


def test_fast_dropout_reaches_dora_as_any_dropout_does():
    """DoRA's forward (PEFT's DoraLinearVariant) takes the LoRA input through the dropout module: with the fast
    masks it gives what PEFT gives with those masks replayed by a module of its own."""
    from dragon_dagster.engine.train import dropout
    from dragon_dagster.engine.train.dropout import FastDropout, use_fast_dropout

    model = peft_model(r=4, alpha=8, dropout=0.1, use_dora=True)
    assert use_fast_dropout(model) == 14
    masks = []
    for module in model.modules():
        if isinstance(module, FastDropout):
            module.register_forward_hook(lambda m, inputs, out: masks.append(out / inputs[0]))
    # 2,048 tokens: every adapter's input is large enough for the fast masks (dropout.SMALL)
    ids = torch.randint(0, 300, (16, 128), generator=torch.Generator().manual_seed(2))
    fast = model(input_ids=ids).logits

    class Replay(torch.nn.Module):
        def forward(self, x):
            return x * replayed.pop(0)

    replayed = list(masks)
    for module in model.modules():
        dropouts = getattr(module, "lora_dropout", None)
        if isinstance(dropouts, torch.nn.ModuleDict):
            for name in dropouts:
                dropouts[name] = Replay()
    fast_scale = dropout.LEVELS / (dropout.LEVELS - round(0.1 * dropout.LEVELS))  # torch's would be 1 / 0.9
    assert len(masks) == 14
    for mask in masks:  # some inputs dropped, the rest scaled as the fast masks scale them
        kept = mask[mask != 0]
        assert 0 < kept.numel() < mask.numel() and torch.allclose(kept, torch.full_like(kept, fast_scale), rtol=1e-4)
    assert torch.allclose(model(input_ids=ids).logits, fast, atol=1e-5) and not replayed
