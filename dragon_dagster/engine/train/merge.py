"""Fold a chain of adapters into their base model: a standalone directory plain transformers loads, with a model
card (README.md) saying what it was trained from and how."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..artifacts import dir_size
from ..evaluate.replies import generate
from ..export.card import card_facts, merged_card
from ..models import load_model, load_tokenizer
from ..reporter import Reporter
from ..spec.settings import Hardware, build
from ..spec.stages import Merge


@dataclass
class MergeJob:
    settings: Merge
    model: str
    adapters: list[str]
    output_dir: str
    hardware: dict = field(default_factory=dict)


def merge_chain(job: MergeJob, reporter: Reporter) -> dict:
    if not job.adapters:
        raise ValueError("nothing to merge: the pipeline has no adapter stage before the merge")
    hardware = build(Hardware, job.hardware, "hardware")
    if hardware.load_in_4bit:  # a merged model must hold full weights
        hardware = Hardware(device=hardware.device, dtype=hardware.dtype, load_in_4bit=False)
    reporter.log(f"merging {len(job.adapters)} adapter(s) into {job.model}")
    tokenizer = load_tokenizer(job.model)
    model = load_model(job.model, hardware, adapters=job.adapters)
    out = Path(job.output_dir) / "model"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    facts = card_facts(job.adapters, job.model)  # from the adapters' manifests, beside each adapter directory
    stage_names = " + ".join(s["name"] for s in facts["stages"])
    base_name = Path(facts["base_model"]).name if Path(facts["base_model"]).is_absolute() else facts["base_model"]
    (out / "README.md").write_text(merged_card(facts, f"{base_name} + {stage_names or 'adapters'}"))
    sample = generate(model, tokenizer, [[{"role": "user", "content": job.settings.sample_prompt}]], max_new_tokens=48)[
        0
    ]
    info = {
        "model_dir": str(out),
        "size_mb": round(dir_size(out) / 1e6, 1),
        "parameters": sum(p.numel() for p in model.parameters()),
        "sample_prompt": job.settings.sample_prompt,
        "sample_reply": sample,
        "card": facts,
    }
    reporter.log(f"merged model: {info['parameters']:,} parameters, {info['size_mb']} MB")
    return info
