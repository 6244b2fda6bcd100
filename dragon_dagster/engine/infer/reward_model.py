"""A learned reward model at work: load the base model with a reward_model stage's adapter and scalar head, and
score replies to their prompts, rendered as TRL's RewardTrainer rendered its training pairs (the whole
conversation through the chat template), so a score means here what it meant in training."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..config.hardware import Hardware
from ..models import ModelError, load_tokenizer, pick_device, pick_dtype


@dataclass
class RewardScorer:
    """A loaded reward model: `score(prompts, replies)` is one scalar per reply (higher: preferred)."""

    model: object
    tokenizer: object
    max_length: int = 1024
    batch_size: int = 8

    def encode(self, prompt: Sequence[dict] | str, reply: str) -> list[int]:
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        ids = self.tokenizer.apply_chat_template(
            messages + [{"role": "assistant", "content": reply}], tokenize=True, return_dict=True
        )["input_ids"]
        return ids[-self.max_length :]  # the reply's end is what the head reads (the last token)

    def score(self, prompts: Sequence[Sequence[dict] | str], replies: Sequence[str]) -> list[float]:
        import torch

        if len(prompts) != len(replies):
            raise ValueError(f"{len(replies)} replies for {len(prompts)} prompts")
        device = next(self.model.parameters()).device
        pad = self.tokenizer.pad_token_id
        out: list[float] = []
        for start in range(0, len(replies), self.batch_size):
            encoded = [
                self.encode(p, r)
                for p, r in zip(prompts[start : start + self.batch_size], replies[start : start + self.batch_size])
            ]
            width = max(len(ids) for ids in encoded)
            input_ids = torch.full((len(encoded), width), pad, dtype=torch.long)
            attention = torch.zeros_like(input_ids)
            for i, ids in enumerate(encoded):  # right padding: the head reads the last non-pad token
                input_ids[i, : len(ids)] = torch.tensor(ids)
                attention[i, : len(ids)] = 1
            with torch.no_grad():
                logits = self.model(input_ids=input_ids.to(device), attention_mask=attention.to(device)).logits
            out += [float(v) for v in logits[:, 0].float().cpu()]
        return out


def load_scorer(base_model: str, adapter: str | Path, hardware: Hardware | None = None, max_length: int = 1024):
    """The reward model a reward_model stage trained: base_model (its resolved model) with adapter/ on top."""
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification

    hardware = hardware or Hardware()
    device = pick_device(hardware)
    tokenizer = load_tokenizer(str(adapter))  # saved with the pad token TRL set
    try:
        model = AutoModelForSequenceClassification.from_pretrained(
            base_model, num_labels=1, dtype=pick_dtype(hardware, device)
        )
        model = PeftModel.from_pretrained(model, str(adapter))  # the LoRA weights and the trained score head
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot load reward model {adapter} on {base_model!r}: {exc}") from exc
    model.config.pad_token_id = tokenizer.pad_token_id
    model.to(device).eval()
    return RewardScorer(model, tokenizer, max_length=max_length)
