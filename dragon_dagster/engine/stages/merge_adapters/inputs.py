"""What the merge_adapters worker reads, and whether its adapters can be combined at all, decided from their
manifests and adapter configs before any model loads (the Dagster step asks first; the worker asks again)."""

from __future__ import annotations

import json
from pathlib import Path

from ...artifacts.manifest import AdapterManifest, read_manifest
from ...config.job import Contract, JobPath
from .settings import SAME_RANK, MergeAdapters


class CombineInputs(Contract):
    """The base model, the adapters folded into it before the inputs (their shared chain), and the inputs."""

    model: JobPath  # what from_pretrained loads: the inputs' resolved base model
    before: list[JobPath] = []  # the chain the inputs sit on, folded in first
    adapters: list[JobPath]  # each input's adapter/ directory, in the settings' order
    labels: list[str]  # each input as the settings name it (a stage, or an artifact path)


def adapter_config(adapter: str | Path) -> dict:
    return json.loads((Path(adapter) / "adapter_config.json").read_text())


def combine_inputs(settings: MergeAdapters, artifacts: list[str | Path]) -> tuple[CombineInputs, list[AdapterManifest]]:
    """The worker's inputs from the input artifacts (in the settings' order), or a ValueError naming what makes
    them uncombinable and the fix: another base model, another chain before them, and what check_configs
    refuses."""
    labels = [ref.label for ref in settings.adapters]
    manifests = [read_manifest(a, AdapterManifest) for a in artifacts]
    where = f"merge_adapters stage {settings.name!r}"
    bases = {m.resolved_model for m in manifests}
    if len(bases) > 1:
        shown = "; ".join(f"{label} on {m.resolved_model}" for label, m in zip(labels, manifests))
        raise ValueError(
            f"{where}: its adapters are trained on different base models ({shown}); an adapter's update only means "
            "something on its own base: combine adapters trained on the same model"
        )
    befores = {tuple(m.chain[:-1]) for m in manifests}
    if len(befores) > 1:
        shown = "; ".join(f"{label} on {len(m.chain) - 1} adapter(s) before it" for label, m in zip(labels, manifests))
        raise ValueError(
            f"{where}: its adapters continue from different chains ({shown}), so their updates apply to different "
            "weights: combine adapters that start from the same model with the same adapters before them (an "
            "sft stage with `start: base` starts from the pipeline's model)"
        )
    check_configs(settings, labels, [m.chain[-1] for m in manifests])
    inputs = CombineInputs(
        model=manifests[0].resolved_model,
        before=list(manifests[0].chain[:-1]),
        adapters=[m.chain[-1] for m in manifests],
        labels=labels,
    )
    return inputs, manifests


def check_configs(settings: MergeAdapters, labels: list[str], adapters: list[str | Path]) -> None:
    """Refuse what PEFT's add_weighted_adapter cannot combine faithfully: a non-LoRA adapter, a DoRA adapter
    (its magnitude vectors would be dropped), a reward model (its score head), ranks the combination cannot mix."""
    where = f"merge_adapters stage {settings.name!r}"
    configs = [adapter_config(a) for a in adapters]
    for label, config in zip(labels, configs):
        if config.get("peft_type") != "LORA":
            raise ValueError(f"{where}: {label!r} is a {config.get('peft_type')} adapter; only LoRA adapters combine")
        if config.get("task_type") == "SEQ_CLS":
            raise ValueError(f"{where}: {label!r} is a reward model (it scores replies), not an adapter to combine")
        if config.get("use_dora"):
            raise ValueError(
                f"{where}: {label!r} is a DoRA adapter; PEFT's add_weighted_adapter combines LoRA's A and B "
                "matrices but not DoRA's magnitude vectors, so the combination would silently drop them: merge it "
                "into the base model on its own (a merge stage) or train it without use_dora"
            )
    ranks = {label: config["r"] for label, config in zip(labels, configs)}
    if settings.combination in SAME_RANK and len(set(ranks.values())) > 1:
        raise ValueError(
            f"{where}: combination {settings.combination} needs adapters of one rank, and these differ ({ranks}): "
            "use svd or cat (or a _svd form), which combine any ranks, or train them at one lora.r"
        )
