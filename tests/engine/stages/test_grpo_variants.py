"""GRPO's loss variants (stages/grpo/variants.py) on this project's fast paths, against TRL's own computation.

Each variant is set the way a pipeline sets it, on the stage's settings, and reaches the trainer through GRPOConfig,
each field by its name (stages/grpo/trl_config.py). Two trainers are built on the tiny model with the same LoRA
weights: TRL's path (the chunked head off) and FastGRPOTrainer with the chunked head and unpad on. Both get the same
fixed batch, the dict _generate_and_score_completions returns, and compute_loss must give the same loss and
gradients. The variants that act before the loss (scale_rewards, mask_truncated_completions, num_iterations) are run
through _generate_and_score_completions on the fast trainer, grouped sampling on, and what it hands the loss is
checked.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from dragon_dagster.engine.stages.grpo.settings import GRPO
from dragon_dagster.engine.stages.grpo.variants import GRPOVariants
from dragon_dagster.engine.train.reinforce.settings import ReinforceStage
from dragon_dagster.engine.train.trl_config import settings_arguments

G = 4  # completions per prompt
C = 6  # completion columns of the fixed batch
EOS_SCALE, HEAD_SCALE = 0.8, 10.0  # measured: 12 of the 16 sampled completions finish, 4 are cut off

LOSSES = {  # a variant: the settings that make it (each loss type as TRL's docs set it up)
    "grpo": {"loss_type": "grpo"},
    "bnpo": {"loss_type": "bnpo"},
    "dr_grpo": {"loss_type": "dr_grpo"},
    "dapo": {"loss_type": "dapo"},
    "cispo": {"loss_type": "cispo", "epsilon_high": 5.0},
    "sapo": {"loss_type": "sapo"},
    "luspo": {"loss_type": "luspo", "importance_sampling_level": "sequence"},
    "vespo": {"loss_type": "vespo"},
}
VARIANTS = {
    **LOSSES,
    "gspo": {"loss_type": "grpo", "importance_sampling_level": "sequence"},
    "sequence_dapo": {"importance_sampling_level": "sequence"},
    "clip_higher": {"epsilon_high": 0.28},
    "two_sided": {"delta": 1.5},
    "top_entropy": {"top_entropy_quantile": 0.2},
    "sapo_temperatures": {"loss_type": "sapo", "sapo_temperature_pos": 2.0, "sapo_temperature_neg": 0.5},
    "vespo_shape": {"loss_type": "vespo", "vespo_k_pos": 1.0, "vespo_lambda_neg": 4.0},
}


def variant_config(settings: GRPO) -> dict:
    """The loss variant's fields as the stage passes them to GRPOConfig (by their names)."""
    from trl import GRPOConfig

    own = set(GRPOVariants.model_fields) - set(ReinforceStage.model_fields)
    return {k: v for k, v in settings_arguments(settings, GRPOConfig).items() if k in own}


def stage(**variant) -> GRPO:
    return GRPO(name="grpo_adapter", kind="grpo", dataset="prompts", rewards=[{"type": "exact"}], **variant)


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    from dragon_dagster.engine import models

    return models.load_tokenizer(str(tiny_model))


@pytest.fixture(scope="module")
def build(tiny_model, tokenizer, tmp_path_factory):
    """build(variant, fast, **config): a trainer for the stage settings variant, on a fresh copy of the tiny model
    with LoRA weights that are the same for every call (B not zero, so the adapter moves the log-probabilities).
    The random model's output head is scaled up (HEAD_SCALE) so that its tokens' entropies spread out instead of all
    sitting near log(49,152), and the end-of-sequence word is made likely enough (EOS_SCALE) that some sampled
    completions finish and others are cut off."""
    from datasets import Dataset
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig

    from dragon_dagster.engine.stages.grpo.trainer import grpo_trainer
    from dragon_dagster.engine.train import unpadded

    out = tmp_path_factory.mktemp("grpo_variants")

    def reward(prompts, completions, completion_ids, **kwargs):
        return [float(sum(ids) % 7) for ids in completion_ids]

    def make(variant: dict, fast: bool, **config):
        model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            head = model.get_output_embeddings().weight
            head.mul_(HEAD_SCALE)
            head[tokenizer.eos_token_id] = torch.randn(32, generator=g) * EOS_SCALE
        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0))
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "lora_" in name:
                    param.copy_(torch.randn(param.shape, generator=g) * 0.1)
        args = {
            "output_dir": str(out),
            "per_device_train_batch_size": 2 * G,
            "generation_batch_size": 4 * G,  # one round serves two steps: step 2 is off-policy (as speed can set)
            "num_generations": G,
            "max_completion_length": C,
            "temperature": 0.7,
            "beta": 0.04,
            "report_to": [],
            "use_cpu": True,
            "bf16": False,  # as common_args sets it on a CPU (TRL defaults to bf16 autocast)
            "logging_steps": 1,
            **config,
        }
        trainer = grpo_trainer()(
            model=model,
            reward_funcs=[reward],
            args=GRPOConfig(**args, **variant_config(stage(**variant))),
            train_dataset=Dataset.from_list([{"prompt": [{"role": "user", "content": "hi"}]}] * 8),
            processing_class=tokenizer,
        )
        if fast:
            trainer.chunked = trainer.unpad = trainer.grouped_sampling = True
            unpadded.use(trainer.model)
        trainer.model.train()
        trainer.current_gradient_accumulation_steps = 1  # set by the training loop; the loss divides by it
        return trainer

    return make


@pytest.fixture(scope="module")
def batch(build, tokenizer) -> dict:
    """Two prompts (left-padded, 7 and 4 tokens), four completions each of 1 to 6 tokens (right-padded), with
    advantages of both signs, and old-policy and reference log-probabilities off the current ones by enough that
    ratios leave the clip range: what _generate_and_score_completions hands compute_loss."""
    trainer = build({}, fast=False)
    g = torch.Generator().manual_seed(1)
    pad, rows = tokenizer.pad_token_id, 2 * G
    prompt_mask = torch.zeros(rows, 7, dtype=torch.long)
    prompt_mask[:G, :] = 1
    prompt_mask[G:, 3:] = 1
    prompt_ids = torch.randint(100, 40000, (2, 7), generator=g).repeat_interleave(G, dim=0)
    prompt_ids = prompt_ids.masked_fill(prompt_mask == 0, pad)
    completion_mask = (torch.arange(C)[None] < torch.tensor([6, 3, 5, 6, 2, 6, 4, 1])[:, None]).long()
    completion_ids = torch.randint(100, 40000, (rows, C), generator=g).masked_fill(completion_mask == 0, pad)
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, torch.cat([prompt_ids, completion_ids], 1), torch.cat([prompt_mask, completion_mask], 1), C
        )
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": torch.tensor([1.2, -0.4, 0.3, -1.1, 0.8, -0.9, 1.5, -1.4]),
        # the round's tokens: this step's and the other step's 9
        "num_items_in_batch": completion_mask.sum() + 9,
        "old_per_token_logps": (logps + 0.5 * torch.randn(rows, C, generator=g)) * completion_mask,
        "ref_per_token_logps": (logps + 0.2 * torch.randn(rows, C, generator=g)) * completion_mask,
    }


def loss_and_grads(trainer, inputs: dict) -> tuple[float, dict]:
    trainer.model.zero_grad()
    loss = trainer.compute_loss(trainer.model, dict(inputs))
    loss.backward()
    grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    return loss.item(), grads


def assert_same(plain: tuple[float, dict], fast: tuple[float, dict]) -> None:
    # cispo and vespo weigh the log-probability itself (about -10.8 on the tiny model's 49,152 words), whose last
    # float32 digits differ between the two heads: 1e-5 of a loss near 1 is that
    assert fast[0] == pytest.approx(plain[0], rel=1e-5, abs=3e-5)
    assert plain[1].keys() == fast[1].keys() and len(plain[1]) == 28  # 14 adapted layers, A and B
    scale = max(g.abs().max().item() for g in plain[1].values())
    assert scale > 0
    for name, grad in plain[1].items():
        assert torch.allclose(fast[1][name], grad, rtol=1e-3, atol=1e-4 * scale), name


@pytest.fixture(scope="module")
def outcome(build, batch):
    """outcome(name): (TRL's loss and gradients, the fast path's) for VARIANTS[name] on the fixed batch, once."""
    done: dict[str, tuple] = {}

    def run(name: str):
        if name not in done:
            done[name] = tuple(loss_and_grads(build(VARIANTS[name], fast), batch) for fast in (False, True))
        return done[name]

    return run


@pytest.mark.parametrize("name", list(VARIANTS))
def test_each_variant_gives_trls_loss_and_gradients_on_the_fast_path(name, outcome):
    plain, fast = outcome(name)
    assert_same(plain, fast)


def test_each_setting_changes_the_loss_where_trls_formulas_differ(outcome):
    """So each setting reaches TRL's loss: every loss type gives its own number on the batch, and the others
    move the default (dapo) loss."""
    losses = {name: round(outcome(name)[0][0], 6) for name in LOSSES}
    assert len(set(losses.values())) == len(LOSSES), losses
    default = outcome("dapo")[0][0]
    for name in ("sequence_dapo", "clip_higher", "two_sided", "top_entropy"):
        assert outcome(name)[0][0] != pytest.approx(default, rel=1e-4), name
    assert outcome("gspo")[0][0] != pytest.approx(outcome("grpo")[0][0], rel=1e-4)
    assert outcome("sapo_temperatures")[0][0] != pytest.approx(outcome("sapo")[0][0], rel=1e-4)
    assert outcome("vespo_shape")[0][0] != pytest.approx(outcome("vespo")[0][0], rel=1e-4)


def test_top_entropy_quantile_keeps_the_same_tokens_on_both_paths(build, batch):
    """The share of tokens kept is a cut through the entropies: the two heads' entropies differ in their last float32
    digits (1e-4 of about 10), so the batch's entropies must sit further than that from the cut for the comparison
    above to hold; they do, and both paths keep the same tokens."""
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    kept, entropies = [], []
    for fast in (False, True):
        trainer = build(VARIANTS["top_entropy"], fast)
        with torch.no_grad():
            _, entropy, _ = trainer._get_per_token_logps_and_entropies(
                trainer.model, ids, mask, C, compute_entropy=True
            )
        entropies.append(entropy)
        kept.append(trainer.get_high_entropy_mask(entropy, batch["completion_mask"], 1 - trainer.top_entropy_quantile))
    real = batch["completion_mask"].bool()
    assert torch.allclose(entropies[0][real], entropies[1][real], atol=2e-4)
    assert torch.equal(kept[0], kept[1])
    assert 0.2 <= kept[0].sum() / real.sum() < 0.5  # a fifth, and the ties at the cut (a group's first tokens)
    cut = torch.quantile(entropies[0][real], 0.8)
    assert (entropies[0][real] - cut).abs().min() > 1e-3


def prompts(n: int) -> list[dict]:
    """n prompts, each G times in a row, as TRL's sampler repeats them."""
    return [{"prompt": [{"role": "user", "content": f"What is {i} + {i}?"}]} for i in range(n) for _ in range(G)]


def generated(trainer, n_prompts: int = 4, seed: int = 0) -> dict:
    torch.manual_seed(seed)
    return trainer._generate_and_score_completions(prompts(n_prompts))


@pytest.fixture(scope="module")
def scaled(build):
    """scale_rewards -> (the rewards and advantages the fast trainer formed, its output, the plain trainer)."""
    done: dict[str, tuple] = {}

    def run(mode: str):
        if mode not in done:
            fast = build({"scale_rewards": mode}, fast=True)
            out = generated(fast)
            rewards = torch.tensor(list(fast._logs["rewards"]["reward"]))
            done[mode] = (rewards, out["advantages"], out, fast, build({"scale_rewards": mode}, fast=False))
        return done[mode]

    return run


@pytest.mark.parametrize("mode", ["group", "batch", "none"])
def test_scale_rewards_reach_the_advantages_and_the_loss_on_the_fast_path(mode, scaled):
    rewards, advantages, out, fast, plain = scaled(mode)
    groups = rewards.view(-1, G)
    centred = (groups - groups.mean(1, keepdim=True)).flatten()
    spread = {"group": groups.std(1).repeat_interleave(G), "batch": rewards.std(), "none": None}[mode]
    expected = centred if spread is None else centred / (spread + 1e-4)
    assert rewards.std() > 0 and torch.allclose(advantages, expected, atol=1e-5)
    assert_same(loss_and_grads(plain, out), loss_and_grads(fast, out))


def test_the_three_scalings_give_different_advantages_from_the_same_samples(scaled):
    outs = {mode: scaled(mode) for mode in ("group", "batch", "none")}
    assert all(torch.equal(o[0], outs["group"][0]) for o in outs.values())  # the same sampled completions
    assert not torch.allclose(outs["group"][1], outs["batch"][1])
    assert not torch.allclose(outs["group"][1], outs["none"][1])


def test_mask_truncated_completions_leaves_cut_off_completions_out_on_the_fast_path(build, tokenizer):
    fast = build({"mask_truncated_completions": True}, fast=True)
    out = generated(fast)
    finished = torch.tensor([tokenizer.eos_token_id in row.tolist() for row in out["completion_ids"]])
    assert 0 < int(finished.sum()) < len(finished)  # some finished, some cut off at max_new_tokens
    assert (out["completion_mask"][~finished] == 0).all() and (out["completion_mask"][finished].sum(1) > 0).all()
    assert out["num_items_in_batch"] == out["completion_mask"].sum()
    # the same samples without the setting keep the cut-off completions
    kept = generated(build({}, fast=True))
    assert torch.equal(kept["completion_ids"], out["completion_ids"])
    assert (kept["completion_mask"][~finished].sum(1) == C).all()
    # rows with no completion token left: unpad and the recorded log-probabilities (zero there) handle them
    plain = build({"mask_truncated_completions": True}, fast=False)
    assert_same(loss_and_grads(plain, out), loss_and_grads(fast, out))


@pytest.mark.parametrize("iterations", [1, 2])
def test_num_iterations_takes_the_old_policy_from_sampling_when_trl_would_compute_it(iterations, build):
    """A round of one step's completions (generation_batch_size = the step's): with num_iterations 1 it is on-policy
    and TRL computes no old log-probabilities; with 2 the second step reuses it, TRL asks for the old policy's, and
    the fast trainer gives the ones recorded while sampling, which are what a forward pass gives."""
    fast = build({"num_iterations": iterations}, fast=True, generation_batch_size=2 * G)
    given = []
    sampling_logps = fast.sampling_logps

    def spy(*args):
        given.append(sampling_logps(*args))
        return given[-1]

    fast.sampling_logps = spy
    out = generated(fast, n_prompts=2)
    plain = build({"num_iterations": iterations}, fast=False, generation_batch_size=2 * G)
    if iterations == 1:
        assert "old_per_token_logps" not in out and all(g is None for g in given)
        assert_same(loss_and_grads(plain, out), loss_and_grads(fast, out))
        return
    assert given[0] is not None and torch.equal(given[0], out["old_per_token_logps"])
    ids = torch.cat([out["prompt_ids"], out["completion_ids"]], 1)
    mask = torch.cat([out["prompt_mask"], out["completion_mask"]], 1)
    with torch.no_grad():
        forward, _, _ = plain._get_per_token_logps_and_entropies(
            plain.model, ids, mask, ids.shape[1] - out["prompt_ids"].shape[1]
        )
    assert torch.allclose(out["old_per_token_logps"], forward * out["completion_mask"], atol=1e-4)
    assert_same(loss_and_grads(plain, out), loss_and_grads(fast, out))


# ------------------------------------------------------------------------------------------- settings


def test_the_settings_reach_grpo_config_with_trls_defaults():
    from dataclasses import fields

    from trl import GRPOConfig

    trl_defaults = {f.name: f.default for f in fields(GRPOConfig)}
    config = variant_config(stage())
    assert set(config) == set(GRPOVariants.model_fields) - set(ReinforceStage.model_fields)
    assert config == {name: trl_defaults[name] for name in config}  # unset, a stage trains as TRL would
    chosen = {
        "loss_type": "grpo",
        "importance_sampling_level": "sequence",
        "epsilon": 0.1,
        "epsilon_high": 0.3,
        "delta": 2.0,
        "scale_rewards": "batch",
        "mask_truncated_completions": True,
        "num_iterations": 3,
        "top_entropy_quantile": 0.5,
    }
    made = GRPOConfig(output_dir="unused", use_cpu=True, bf16=False, **variant_config(stage(**chosen)))
    assert {name: getattr(made, name) for name in chosen} == chosen


def test_the_loss_types_are_the_ones_trl_documents():
    from dataclasses import fields
    from typing import get_args

    from trl import GRPOConfig

    help_text = next(f for f in fields(GRPOConfig) if f.name == "loss_type").metadata["help"]
    documented = re.search(r"Supported values are (.*?)\. ", help_text).group(1)
    assert set(re.findall(r"'(\w+)'", documented)) == set(get_args(GRPOVariants.model_fields["loss_type"].annotation))


def test_the_worker_passes_the_variant_to_grpo_config(tiny_model, tmp_path, monkeypatch):
    import trl

    from dragon_dagster.engine import catalog
    from dragon_dagster.engine.config.hardware import Hardware
    from dragon_dagster.engine.config.job import TrainingInputs
    from dragon_dagster.engine.config.reporter import Reporter
    from dragon_dagster.engine.data import tables
    from dragon_dagster.engine.stages.grpo.worker import train_grpo

    tables.write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": [{"role": "user", "content": "1+1"}], "reference": "2"}])
    settings = stage(loss_type="cispo", epsilon_high=4.0, num_iterations=2, scale_rewards="none")
    job = catalog.get("grpo").job_model()(
        settings=settings,
        inputs=TrainingInputs(
            model=str(tiny_model), train_file=str(tmp_path / "prompts.jsonl"), checkpoint_dir=str(tmp_path / "ckpt")
        ),
        output_dir=str(tmp_path),
        hardware=Hardware(device="cpu"),
    )
    seen = {}

    class Stop(Exception):
        pass

    class Config(trl.GRPOConfig):  # TRL's class, stopped once built: what it was given is what the worker passes
        def __post_init__(self):
            seen.update(vars(self))
            raise Stop

    monkeypatch.setattr(trl, "GRPOConfig", Config)
    with pytest.raises(Stop):
        train_grpo(job, Reporter())
    assert {k: seen[k] for k in variant_config(settings)} == variant_config(settings)
    assert seen["loss_type"] == "cispo" and seen["epsilon_high"] == 4.0 and seen["num_iterations"] == 2


REFUSED = [
    ({"epsilon_high": 0.1}, r"epsilon_high \(0.1\) is below epsilon \(0.2\)"),
    ({"loss_type": "cispo"}, r"cispo caps the importance weight at epsilon_high \(0.2, from epsilon\)"),
    ({"loss_type": "luspo"}, r"luspo .* needs importance_sampling_level: sequence"),
    ({"loss_type": "vespo", "importance_sampling_level": "sequence"}, r"vespo .* leave it at token"),
    ({"delta": 1.1}, r"delta \(1.1\) must be above 1 \+ epsilon_high \(1.2\)"),
    ({"loss_type": "sapo", "epsilon_high": 0.28}, r"epsilon_high has no effect with loss_type sapo"),
    ({"loss_type": "cispo", "epsilon_high": 5.0, "delta": 3.0}, r"delta has no effect with loss_type cispo"),
    ({"sapo_temperature_neg": 2.0, "vespo_k_pos": 1.0}, r"sapo_temperature_neg, vespo_k_pos have no effect"),
]


@pytest.mark.parametrize(("variant", "message"), REFUSED, ids=[m.split(" ")[0] for _, m in REFUSED])
def test_combinations_that_cannot_work_are_refused_naming_the_stage(variant, message):
    with pytest.raises(ValidationError, match=f"grpo stage 'grpo_adapter': .*{message}"):
        stage(**variant)


@pytest.mark.parametrize(
    ("variant", "field"),
    [
        ({"loss_type": "gspo"}, "loss_type"),
        ({"scale_rewards": True}, "scale_rewards"),
        ({"top_entropy_quantile": 1.5}, "top_entropy_quantile"),
        ({"num_iterations": 0}, "num_iterations"),
        ({"epsilon": 1.0}, "epsilon"),
    ],
)
def test_values_trl_does_not_take_are_named(variant, field):
    with pytest.raises(ValidationError) as refused:
        stage(**variant)
    assert [e["loc"] for e in refused.value.errors()] == [(field,)]


def test_a_refused_combination_stops_the_pipeline_loading(tmp_path):
    import dragon_dagster
    from dragon_dagster.engine.pipeline import PipelineError, load

    bundled = Path(dragon_dagster.__file__).parent / "defs" / "support" / "defs.yaml"
    text = bundled.read_text()
    assert text.count("      kind: grpo\n") == 1
    path = tmp_path / "defs.yaml"
    path.write_text(text.replace("      kind: grpo\n", "      kind: grpo\n      loss_type: luspo\n"))
    with pytest.raises(PipelineError, match="grpo stage 'grpo_adapter': loss_type luspo .* needs importance_sampling"):
        load(path)
    path.write_text(
        text.replace(
            "      kind: grpo\n",
            "      kind: grpo\n      loss_type: luspo\n      importance_sampling_level: sequence\n",
        )
    )
    assert load(path).stage("grpo_adapter").loss_type == "luspo"
