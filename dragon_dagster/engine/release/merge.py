"""Fold a chain of adapters into their base model: a standalone directory plain transformers loads, with a model
card (README.md) saying what it was trained from and how."""

from __future__ import annotations

from pathlib import Path

from ..artifacts.directories import dir_size
from ..artifacts.manifest import MergeResult
from ..config.hardware import Hardware
from ..config.reporter import Reporter
from ..infer.generation import generate
from ..models import chain_tokenizer, load_model
from .card import card_facts, merged_card


def merge_adapters(
    model: str, adapters: list[str], out: Path, hardware: Hardware, sample_prompt: str, reporter: Reporter
) -> MergeResult:
    """Write model (a directory or hub id) with the adapters folded in, in order, into out; a sample reply to
    sample_prompt shows it works."""
    if not adapters:
        raise ValueError("nothing to merge: the pipeline has no adapter stage before the merge")
    if hardware.load_in_4bit:  # a merged model must hold full weights
        hardware = hardware.model_copy(update={"load_in_4bit": False})
    reporter.log(f"merging {len(adapters)} adapter(s) into {model}")
    tokenizer = chain_tokenizer(model, adapters)  # the chat template training rendered with
    merged = load_model(model, hardware, adapters=adapters)
    out = Path(out)
    merged.save_pretrained(out)
    tokenizer.save_pretrained(out)
    facts = card_facts(adapters, model)  # from the adapters' manifests, beside each adapter directory
    stage_names = " + ".join(s["name"] for s in facts["stages"])
    base_name = Path(facts["base_model"]).name if Path(facts["base_model"]).is_absolute() else facts["base_model"]
    (out / "README.md").write_text(merged_card(facts, f"{base_name} + {stage_names or 'adapters'}"))
    sample = generate(merged, tokenizer, [[{"role": "user", "content": sample_prompt}]], max_new_tokens=48)[0]
    info = MergeResult(
        model_dir=str(out),
        size_mb=round(dir_size(out) / 1e6, 1),
        parameters=sum(p.numel() for p in merged.parameters()),
        sample_prompt=sample_prompt,
        sample_reply=sample,
        card=facts,
    )
    reporter.log(f"merged model: {info.parameters:,} parameters, {info.size_mb} MB")
    return info
