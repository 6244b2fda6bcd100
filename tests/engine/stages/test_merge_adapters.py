"""merge_adapters: adapters combined by PEFT's add_weighted_adapter with the stage's settings, saved as an adapter
that loads like a trainer's; what PEFT cannot combine faithfully (DoRA, other bases, other chains) refused."""

from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from dragon_dagster.engine import models
from dragon_dagster.engine.artifacts.manifest import AdapterManifest, write_manifest
from dragon_dagster.engine.config.hardware import Hardware
from dragon_dagster.engine.config.job import Job
from dragon_dagster.engine.config.reporter import Reporter
from dragon_dagster.engine.config.results import TrainingSummary
from dragon_dagster.engine.stages.merge_adapters.inputs import CombineInputs, combine_inputs
from dragon_dagster.engine.stages.merge_adapters.settings import MergeAdapters
from dragon_dagster.engine.stages.merge_adapters.worker import combine, merge_adapter_set

CPU = Hardware(device="cpu")


def settings(**values) -> MergeAdapters:
    return MergeAdapters(name="combined", kind="merge_adapters", adapters=["a", "b"], **values)


def make_adapter(model: Path, out: Path, seed: int, r: int = 4, **lora) -> Path:
    """A LoRA adapter on model made with PEFT directly: random A and B (init_lora_weights=False), so it changes
    the model and two seeds make two different updates."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    config = LoraConfig(r=r, lora_alpha=2 * r, target_modules=["q_proj", "v_proj"], init_lora_weights=False, **lora)
    get_peft_model(models.load_model(str(model), CPU), config).save_pretrained(out)
    return out


def adapter_artifact(directory: Path, adapter: Path, model: str, chain_before: list[str] | None = None) -> Path:
    """An adapter artifact (manifest beside adapter/) as a training stage writes one."""
    directory.mkdir(parents=True)
    write_manifest(
        directory,
        AdapterManifest[TrainingSummary](
            stage=directory.name,
            method="sft",
            base_model=model,
            resolved_model=model,
            chain=[*(chain_before or []), str(adapter)],
            dataset="",
            settings={},
            result=TrainingSummary(objective="sft"),
        ),
    )
    return directory


@pytest.fixture(scope="module")
def two_adapters(tiny_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("combine")
    return [make_adapter(tiny_model, root / name / "adapter", seed) for name, seed in (("a", 1), ("b", 2))]


def lora_tensors(peft_model, adapter: str) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in peft_model.named_parameters() if f".{adapter}." in n and "lora_" in n}


def peft_own(model: Path, adapters: list[Path], weights: list[float], **options):
    """PEFT's add_weighted_adapter called by hand on the same inputs: what the stage must reproduce."""
    from peft import PeftModel

    peft = PeftModel.from_pretrained(models.load_model(str(model), CPU), adapters[0], adapter_name="x0")
    peft.load_adapter(adapters[1], adapter_name="x1")
    torch.manual_seed(options.pop("seed", 0))
    peft.add_weighted_adapter(["x0", "x1"], weights, "mine", **options)
    return lora_tensors(peft, "mine")


@pytest.mark.parametrize(
    "values, options",
    [
        ({"combination": "ties", "density": 0.5, "weights": [0.7, 0.3]}, {"density": 0.5}),
        ({"combination": "dare_linear", "density": 0.4, "seed": 3}, {"density": 0.4, "seed": 3}),
        ({"combination": "svd", "svd_rank": 6}, {"svd_rank": 6}),
        ({"combination": "magnitude_prune_svd", "density": 0.5, "svd_rank": 2}, {"density": 0.5, "svd_rank": 2}),
    ],
)
def test_the_settings_reach_peft(tiny_model, two_adapters, values, options):
    """The combined adapter's tensors are exactly PEFT's own add_weighted_adapter result for the same combination
    type, weights, density, rank and seed (and differ from another seed's or density's)."""
    stage = settings(**values)
    combined = lora_tensors(combine(models.load_model(str(tiny_model), CPU), two_adapters, stage), "default")
    expected = peft_own(
        tiny_model, two_adapters, stage.effective_weights(), combination_type=stage.combination, **options
    )
    assert combined and len(combined) == len(expected)
    renamed = {n.replace(".default.", ".mine."): v for n, v in combined.items()}
    assert renamed.keys() == expected.keys()
    for name, value in expected.items():
        assert torch.equal(renamed[name], value), name


def test_cat_adds_the_weighted_updates(tiny_model, two_adapters, tmp_path):
    """The effect: the combined adapter, saved and folded into the base as a merge does, changes each weight by
    exactly the weighted sum of the inputs' own updates (cat is PEFT's exact combination), and the saved adapter
    has the summed rank."""
    base = models.load_model(str(tiny_model), CPU)
    alone = [models.load_model(str(tiny_model), CPU, adapters=[str(a)]) for a in two_adapters]
    weights = [0.25, 1.5]
    job = Job[MergeAdapters, CombineInputs](
        settings=settings(combination="cat", weights=weights),
        inputs=CombineInputs(model=str(tiny_model), adapters=[str(a) for a in two_adapters], labels=["a", "b"]),
        output_dir=str(tmp_path),
        hardware=CPU,
    )
    result = merge_adapter_set(job, Reporter())
    assert result.rank == 8 and result.input_ranks == [4, 4] and result.weights == weights
    merged = models.load_model(str(tiny_model), CPU, adapters=[str(tmp_path / "adapter")])
    before, after = base.state_dict(), merged.state_dict()
    a, b = alone[0].state_dict(), alone[1].state_dict()
    changed = 0
    for name, weight in before.items():
        expected = weight + weights[0] * (a[name] - weight) + weights[1] * (b[name] - weight)
        torch.testing.assert_close(after[name], expected, atol=1e-6, rtol=1e-5)
        changed += not torch.equal(after[name], weight)
    assert changed == 4  # q_proj and v_proj of both layers


def test_dora_adapters_are_refused(tiny_model, two_adapters, tmp_path):
    dora = make_adapter(tiny_model, tmp_path / "dora", seed=3, use_dora=True)
    with pytest.raises(ValueError, match="'b' is a DoRA adapter.*magnitude vectors.*without use_dora"):
        combine(models.load_model(str(tiny_model), CPU), [two_adapters[0], dora], settings(), ["a", "b"])


def test_ranks_that_the_combination_cannot_mix_are_refused(tiny_model, two_adapters, tmp_path):
    wide = make_adapter(tiny_model, tmp_path / "wide", seed=3, r=8)
    with pytest.raises(ValueError, match="ties needs adapters of one rank.*use svd or cat"):
        combine(
            models.load_model(str(tiny_model), CPU), [two_adapters[0], wide], settings(combination="ties", density=0.5)
        )


def test_adapters_on_other_bases_or_chains_are_refused(tiny_model, two_adapters, tmp_path):
    a = adapter_artifact(tmp_path / "a", two_adapters[0], str(tiny_model))
    elsewhere = adapter_artifact(tmp_path / "b", two_adapters[1], str(tmp_path / "another_model"))
    with pytest.raises(ValueError, match="trained on different base models.*combine adapters trained on the same"):
        combine_inputs(settings(), [a, elsewhere])
    continued = adapter_artifact(tmp_path / "c", two_adapters[1], str(tiny_model), chain_before=[str(two_adapters[0])])
    with pytest.raises(ValueError, match="continue from different chains.*start: base"):
        combine_inputs(settings(), [a, continued])
    inputs, _ = combine_inputs(settings(), [a, adapter_artifact(tmp_path / "d", two_adapters[1], str(tiny_model))])
    assert inputs.model == str(tiny_model) and inputs.before == [] and inputs.adapters == [str(p) for p in two_adapters]


@pytest.mark.parametrize(
    "values, message",
    [
        ({"combination": "ties"}, "ties prunes each update to a density: set density"),
        ({"combination": "dare_ties_svd"}, "dare_ties_svd prunes each update to a density: set density"),
        ({"combination": "linear", "density": 0.5}, "linear prunes nothing, so density would be unused"),
        ({"combination": "cat", "svd_rank": 4}, "svd_rank is read only by svd"),
        ({"combination": "dare_linear", "density": 0.5, "majority_sign_method": "frequency"}, "read only by ties"),
        ({"weights": [1.0]}, "1 weights for 2 adapters"),
    ],
)
def test_settings_peft_would_misread_are_refused(values, message):
    with pytest.raises(ValidationError, match=message):
        settings(**values)


def test_an_adapter_is_a_stage_or_an_artifact():
    stage = MergeAdapters(name="c", kind="merge_adapters", adapters=["a", {"artifact": "/runs/artifacts/other/sft-1"}])
    assert stage.reads() == ["a"] and stage.artifacts() == ["/runs/artifacts/other/sft-1"]
    assert stage.effective_weights() == [0.5, 0.5]
    with pytest.raises(ValidationError, match="give exactly one"):
        MergeAdapters(name="c", kind="merge_adapters", adapters=["a", {"stage": "b", "artifact": "/x"}])


def pipeline_of(*stages: dict):
    from dragon_dagster.engine.pipeline.definition import Pipeline

    chat = {"name": "chat", "kind": "chat_dataset", "source": "t", "prompt": "{subject}", "response": "reply"}
    return Pipeline.model_validate(
        {"name": "p", "model": "/m", "datasets": {"t": {"path": "example:tickets.csv"}}, "stages": [chat, *stages]}
    )


def test_the_chain_continues_from_a_combined_adapter():
    """Stages after it continue from the combined adapter (a merge folds it, a DPO stage trains on it); an sft stage
    with start: base trains beside the chain, so its adapter and the first share the base."""
    a, b = (
        {"name": "a", "kind": "sft", "dataset": "chat"},
        {"name": "b", "kind": "sft", "dataset": "chat", "start": "base"},
    )
    combined = {"name": "c", "kind": "merge_adapters", "adapters": ["a", "b"], "combination": "cat"}
    pairs = {"name": "pairs", "kind": "preference_pairs", "dataset": "chat"}
    pipeline = pipeline_of(
        a, b, combined, pairs, {"name": "dpo", "kind": "dpo", "dataset": "pairs"}, {"name": "m", "kind": "merge"}
    )
    assert pipeline.previous("b") is None and pipeline.upstream("c") == ["a", "b"] and pipeline.previous("c") is None
    assert pipeline.previous("pairs") == "c" and pipeline.previous("dpo") == "c" and pipeline.upstream("m") == ["dpo"]


def test_a_pipeline_that_combines_adapters_on_different_chains_is_refused():
    a, b = {"name": "a", "kind": "sft", "dataset": "chat"}, {"name": "b", "kind": "sft", "dataset": "chat"}
    with pytest.raises(ValidationError, match="a continues the base model; b continues a.*`start: base`"):
        pipeline_of(a, b, {"name": "c", "kind": "merge_adapters", "adapters": ["a", "b"]})
    with pytest.raises(ValidationError, match="'chat' \\(chat_dataset\\) makes no adapter"):
        pipeline_of(a, {"name": "c", "kind": "merge_adapters", "adapters": ["a", "chat"]})
