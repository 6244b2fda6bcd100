"""The merge_adapters kind's worker: the base (with the chain its inputs share folded in), every input adapter
loaded with PEFT, combined by PEFT's add_weighted_adapter, and the result saved as an adapter like a trainer's."""

from __future__ import annotations

from pathlib import Path

from ...config.job import Job
from ...config.reporter import Reporter
from ...models import chain_tokenizer, load_model
from .inputs import CombineInputs, adapter_config, check_configs
from .result import MergeAdaptersResult
from .settings import MergeAdapters, base_combination, uses_svd

MergeAdaptersJob = Job[MergeAdapters, CombineInputs]
COMBINED = "default"  # PEFT saves its "default" adapter at the top of the directory, as a trainer's is


def combine(model, adapters: list, settings: MergeAdapters, labels: list[str] | None = None):
    """model (a transformers model) as a PeftModel whose only adapter is the inputs' combination by PEFT's
    add_weighted_adapter, with the arguments the settings give."""
    import torch
    from peft import PeftModel

    check_configs(settings, labels or [str(a) for a in adapters], adapters)
    names = [f"input_{i}" for i in range(len(adapters))]
    peft = PeftModel.from_pretrained(model, adapters[0], adapter_name=names[0])
    for name, adapter in zip(names[1:], adapters[1:]):
        peft.load_adapter(adapter, adapter_name=name)
    options = {}
    if base_combination(settings.combination) in ("ties", "dare_ties", "dare_linear", "magnitude_prune"):
        options["density"] = settings.density
    if settings.majority_sign_method:
        options["majority_sign_method"] = settings.majority_sign_method
    if uses_svd(settings.combination):
        options.update(svd_rank=settings.svd_rank, svd_clamp=settings.svd_clamp)
    torch.manual_seed(settings.seed)  # DARE drops parameters at random
    peft.add_weighted_adapter(
        names, settings.effective_weights(), COMBINED, combination_type=settings.combination, **options
    )
    peft.set_adapter(COMBINED)  # first: deleting the active adapter makes PEFT warn that it picked another
    for name in names:
        peft.delete_adapter(name)
    return peft


def merge_adapter_set(job: MergeAdaptersJob, reporter: Reporter) -> MergeAdaptersResult:
    settings, inputs = job.settings, job.inputs
    # full precision: PEFT's svd forms factor the update with torch.linalg.svd, which takes no bfloat16, and
    # pruning by magnitude wants the factors as trained (adapters are saved in float32)
    hardware = job.hardware.model_copy(update={"load_in_4bit": False, "dtype": "float32"})
    reporter.log(
        f"combining {len(inputs.adapters)} adapters ({', '.join(inputs.labels)}) by {settings.combination} on "
        f"{inputs.model}" + (f" with {len(inputs.before)} adapter(s) folded in first" if inputs.before else "")
    )
    model = load_model(inputs.model, hardware, adapters=inputs.before)
    combined = combine(model, inputs.adapters, settings, inputs.labels)
    out = Path(job.output_dir) / "adapter"
    combined.save_pretrained(out)
    # the chat template training rendered with, as the first input saved it (models.chain_tokenizer reads it)
    chain_tokenizer(inputs.model, [*inputs.before, inputs.adapters[0]]).save_pretrained(out)
    rank = combined.peft_config[COMBINED].r
    parameters = sum(p.numel() for n, p in combined.named_parameters() if "lora_" in n)
    reporter.log(f"combined adapter: rank {rank}, {parameters:,} parameters")
    return MergeAdaptersResult(
        inputs=inputs.labels,
        combination=settings.combination,
        weights=settings.effective_weights(),
        density=settings.density,
        rank=rank,
        input_ranks=[adapter_config(a)["r"] for a in inputs.adapters],
        trainable_parameters=parameters,
    )
