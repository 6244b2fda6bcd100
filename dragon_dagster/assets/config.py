"""Launchpad config: every field left empty keeps the value from the pipeline YAML."""

from __future__ import annotations

from typing import Optional

from dagster import Config
from pydantic import Field

_KEEP = " Empty keeps the pipeline YAML's value."


class DatasetConfig(Config):
    eval_frac: Optional[float] = Field(None, description="Share of rows held out for evaluation, in [0, 1)." + _KEEP)
    seed: Optional[int] = Field(None, description="Seed of the held-out split." + _KEEP)


class SFTStageConfig(Config):
    epochs: Optional[float] = Field(None, description="Passes over the training rows." + _KEEP)
    learning_rate: Optional[float] = Field(None, description="Peak learning rate of the LoRA weights." + _KEEP)
    batch_size: Optional[int] = Field(None, description="Rows per device step." + _KEEP)
    grad_accum: Optional[int] = Field(None, description="Steps whose gradients add up to one update." + _KEEP)
    max_seq_len: Optional[int] = Field(None, description="Longer rows are truncated to this many tokens." + _KEEP)
    max_steps: Optional[int] = Field(None, description="Stop after this many updates (overrides epochs)." + _KEEP)
    warmup_ratio: Optional[float] = Field(None, description="Share of steps warming the learning rate up." + _KEEP)
    weight_decay: Optional[float] = Field(None, description="AdamW weight decay." + _KEEP)
    logging_steps: Optional[int] = Field(None, description="Log metrics every this many steps." + _KEEP)
    save_steps: Optional[int] = Field(None, description="Save a resumable checkpoint every this many steps." + _KEEP)
    gradient_checkpointing: Optional[bool] = Field(None, description="Trade compute for memory." + _KEEP)
    seed: Optional[int] = Field(None, description="Training seed." + _KEEP)
    lora_r: Optional[int] = Field(None, description="LoRA rank." + _KEEP)
    lora_alpha: Optional[int] = Field(None, description="LoRA scaling alpha." + _KEEP)
    lora_dropout: Optional[float] = Field(None, description="LoRA dropout." + _KEEP)
    n_samples: Optional[int] = Field(None, description="Held-out prompts to generate sample replies for." + _KEEP)
    max_new_tokens: Optional[int] = Field(None, description="Length limit of sample replies." + _KEEP)
    resume: bool = Field(False, description="Continue from the last checkpoint a cancelled or failed run left.")

    def args(self) -> dict:
        keys = ("epochs", "learning_rate", "batch_size", "grad_accum", "max_seq_len", "max_steps", "warmup_ratio",
                "weight_decay", "logging_steps", "save_steps", "gradient_checkpointing", "seed")
        return {k: getattr(self, k) for k in keys}

    def lora(self) -> dict:
        return {"r": self.lora_r, "alpha": self.lora_alpha, "dropout": self.lora_dropout}


class MergeConfig(Config):
    sample_prompt: Optional[str] = Field(None, description="A prompt whose reply is shown in the metadata." + _KEEP)


class EvaluateConfig(Config):
    n_samples: Optional[int] = Field(None, description="Sample replies shown side by side." + _KEEP)
    max_eval_rows: Optional[int] = Field(None, description="Held-out rows measured (at most)." + _KEEP)
    max_new_tokens: Optional[int] = Field(None, description="Length limit of generated replies." + _KEEP)
    n_judge: Optional[int] = Field(None, description="Held-out prompts judged pairwise, both orders (0: none)."
                                   + _KEEP)


class PreferenceStageConfig(SFTStageConfig):
    method: Optional[str] = Field(None, description="dpo or orpo." + _KEEP)
    beta: Optional[float] = Field(None, description="Strength of the preference (DPO: KL to the start)." + _KEEP)


class GRPOStageConfig(SFTStageConfig):
    group_size: Optional[int] = Field(None, description="Completions per prompt, 2..64." + _KEEP)
    beta: Optional[float] = Field(None, description="KL penalty to the starting model, 0..10." + _KEEP)
    temperature: Optional[float] = Field(None, description="Sampling temperature, 0.05..3." + _KEEP)
    max_eval_prompts: Optional[int] = Field(None, description="Held-out prompts scored before/after." + _KEEP)


class PairsConfig(Config):
    mode: Optional[str] = Field(None, description="teacher (teacher chosen, student rejected) or judge." + _KEEP)
    n: Optional[int] = Field(None, description="Prompts to make pairs from." + _KEEP)
    n_samples_per_prompt: Optional[int] = Field(None, description="Judge mode: student samples per prompt." + _KEEP)
    min_gap: Optional[float] = Field(None, description="Judge mode: least score gap between chosen and rejected."
                                     + _KEEP)
    temperature: Optional[float] = Field(None, description="Student sampling temperature." + _KEEP)
    max_new_tokens: Optional[int] = Field(None, description="Length limit of sampled replies." + _KEEP)


class SyntheticConfig(Config):
    max_new_tokens: Optional[int] = Field(None, description="Length limit of teacher replies." + _KEEP)
    temperature: Optional[float] = Field(None, description="Teacher sampling temperature." + _KEEP)
    min_score: Optional[float] = Field(None, description="Judge gate: keep rows scored at least this." + _KEEP)
