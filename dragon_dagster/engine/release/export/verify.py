"""Each written GGUF file checked against the model it came from: loaded back with transformers' GGUF loader
(`from_pretrained(dir, gguf_file=...)`, the same dequantization llama.cpp's types define) and asked the fixed
PROMPTS greedily, its replies compared with the model's.

Two figures per file, since they fail differently:
- reply_agreement: the share of prompts whose whole greedy reply is the same, what a user would notice;
- token_agreement: the share of the model's reply tokens the file also picks as its argmax when fed the model's
  reply so far (teacher-forced), so one early flip does not count every later token as a difference.
A quantized file of a small model disagrees more (q4_0 on SmolLM2-135M): the figures record it; the export
stage's check flags a file whose token agreement is under the stage's floor."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# Short support questions and one sum: the kind of reply the pipelines train for, and one with a single answer.
PROMPTS = (
    "My thermostat shows offline after the update.",
    "How do I reset the door lock?",
    "The hub blinks red. What does that mean?",
    "Can I share camera access with my family?",
    "What is 17 + 25?",
)
NEW_TOKENS = 16  # enough for the start of a reply, where a quantized file first departs; each file costs a load


def prompt_ids(tokenizer, prompt: str):
    """The prompt as the model answers it: through its chat template when it has one."""
    import torch

    if tokenizer.chat_template:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    else:
        ids = tokenizer(prompt)["input_ids"]
    return torch.tensor([ids])


def greedy(model, ids, tokenizer):
    """The prompt followed by the model's greedy reply (at most NEW_TOKENS tokens)."""
    import torch

    return model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=NEW_TOKENS,
        do_sample=False,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
    )


@contextmanager
def one_name_map_per_model() -> Iterator[None]:
    """While a file reloads, gguf's tensor name map is built once per (architecture, layer count): transformers'
    loader asks for it again for every module of the model, about 400 times for SmolLM2, which was 6 s of a 16 s
    reload. The map is a lookup table, read only, so one serves every module."""
    import gguf

    built = gguf.get_tensor_name_map
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(built)
    try:
        yield
    finally:
        gguf.get_tensor_name_map = built


class Verifier:
    """The reference model's greedy replies to PROMPTS, made once, and each GGUF file's agreement with them."""

    def __init__(self, model_dir: str | Path):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
        with torch.no_grad():
            # (prompt ids, prompt + reply): the files are compared in float32 against the model in float32
            self.replies = [(ids, greedy(model, ids, self.tokenizer)) for ids in map(self.prompt_ids, PROMPTS)]
        del model

    def prompt_ids(self, prompt: str):
        return prompt_ids(self.tokenizer, prompt)

    def agreement(self, gguf_path: str | Path) -> dict:
        """{"prompts", "identical_replies", "reply_agreement", "tokens", "token_agreement"} for one file."""
        import torch
        from transformers import AutoModelForCausalLM

        gguf_path = Path(gguf_path)
        with one_name_map_per_model():
            model = AutoModelForCausalLM.from_pretrained(
                str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
            ).eval()
        identical = agree = total = 0
        with torch.no_grad():
            for ids, reference in self.replies:
                start = ids.shape[1]
                own = greedy(model, ids, self.tokenizer)
                identical += int(torch.equal(own, reference))
                picked = model(reference).logits[0, start - 1 : -1].argmax(-1)
                agree += int((picked == reference[0, start:]).sum())
                total += reference.shape[1] - start
        del model
        return {
            "prompts": len(self.replies),
            "identical_replies": identical,
            "reply_agreement": round(identical / len(self.replies), 4),
            "tokens": total,
            "token_agreement": round(agree / total, 4) if total else 1.0,
        }
