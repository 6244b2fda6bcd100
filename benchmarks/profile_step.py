"""Where one training step on the real SmolLM2-135M shape spends its time on this machine's CPU.

    python benchmarks/profile_step.py                 # SFT, batch 4 of the peer's rows, this project's CPU defaults
    python benchmarks/profile_step.py --kind dpo      # DPO: chosen and rejected, the policy and the reference pass
    python benchmarks/profile_step.py --plain         # padded batch, torch's dropout: the step before the CPU levers
    python benchmarks/profile_step.py --kind sampling # GRPO's generate(): 8 completions x 32 tokens, lever by lever
    python benchmarks/profile_step.py --kind grpo     # an on-policy GRPO step through the worker, phase by phase

A random-weight model of the anchor's `smol` shape (30 layers, hidden 576, 49,152-word vocabulary) with the
peer's LoRA (r 16, all linear layers, dropout 0.05) runs a few steps of this project's own path (collator,
chunked head, AdamW); the forward and backward of the last one are profiled with torch.profiler and every
operator's own time is put in a bucket by its name and operand shapes: the MLP, the attention (projections,
the kernel, rotary), the LoRA adapters, their dropout, the output head, norms/activations/residuals;
collation and the optimizer step are timed around them. `--kind sampling` times GRPO's sampling instead, one
change at a time from TRL's call (train mode, one prompt repeated per completion). `--kind grpo` runs compare_trl's
GRPO job (8 completions of 32 tokens, beta 0.04) through the worker and splits each step into its phases;
with `--plain` the same trainer takes TRL's own paths (its head and generate, padded rows, torch's dropout).
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_trl import random_model, sentence, sft_rows  # noqa: E402  (the peer's shapes and rows)


def bucket(name: str, shapes: list, hidden: int, inner: int, vocab: int, rank: int) -> str:
    """The part of the model an operator belongs to, from its name and operand shapes."""
    dims = {d for shape in shapes if isinstance(shape, (list, tuple)) for d in shape}
    if "bernoulli" in name or "random_" in name or "dropout" in name:
        return "LoRA dropout masks"
    if "scaled_dot_product" in name or "flash_attention" in name:
        return "attention kernel"
    if name in ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear"):
        if vocab in dims:
            return "output head"
        if rank in dims:
            return "LoRA matmuls"
        if inner in dims:
            return "MLP matmuls"
        return "attention projections"
    if vocab in dims:
        return "output head"
    if inner in dims:
        return "MLP elementwise (SiLU, gate)"
    return "norms, rotary, residuals, other"


def tokenized(tokenizer, rows: list[dict]) -> list[dict]:
    """Prompt-completion rows as TRL's SFT preparation leaves them: labels -100 on the prompt."""
    out = []
    for row in rows:
        full = tokenizer.apply_chat_template(row["prompt"] + row["completion"], tokenize=False)
        prompt = tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
        ids = tokenizer(full)["input_ids"]
        n = len(tokenizer(prompt)["input_ids"])
        out.append({"input_ids": ids, "labels": [-100] * n + ids[n:]})
    return out


def pair_rows(tokenizer, n: int, rng: random.Random) -> list[dict]:
    """Chosen and rejected replies to one prompt each, tokenized as DPO sees them (prompt, then a reply)."""

    def text(low, high):
        return " ".join(sentence(rng, rng.randint(8, 20)) for _ in range(rng.randint(low, high)))

    rows = []
    for _ in range(n):
        prompt = [{"role": "user", "content": text(2, 6)}]
        for reply in (text(2, 8), text(2, 8)):
            rows.append({"prompt": prompt, "completion": [{"role": "assistant", "content": reply}]})
    return tokenized(tokenizer, rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kind", default="sft", choices=["sft", "dpo", "sampling", "grpo"])
    p.add_argument("--bs", type=int, default=4, help="rows (SFT) or pairs (DPO) per step")
    p.add_argument("--plain", action="store_true", help="padded rows and torch's dropout (the levers off)")
    p.add_argument("--steps", type=int, default=3, help="warm-up steps before the profiled one")
    a = p.parse_args()
    if a.kind == "grpo":
        return grpo_phases(a.plain, a.steps + 5)

    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    from dragon_dagster.engine.models import embedded_model_dir
    from dragon_dagster.engine.train import lm_head, unpadded
    from dragon_dagster.engine.train.dropout import use_fast_dropout

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        path = random_model("smol", embedded_model_dir(), Path(tmp) / "smol")
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model = get_peft_model(
        model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, target_modules="all-linear", task_type="CAUSAL_LM")
    )
    unpad = not a.plain
    if unpad:
        unpadded.use(model)
        use_fast_dropout(model)
    model.train()
    if a.kind == "sampling":
        return sampling_table(model, tokenizer)
    config = model.config
    rng = random.Random(0)
    rows = sft_rows(a.bs * (a.steps + 1), rng) if a.kind == "sft" else None
    examples = tokenized(tokenizer, rows) if rows else pair_rows(tokenizer, a.bs * (a.steps + 1), rng)
    per_step = a.bs if a.kind == "sft" else 2 * a.bs
    collator = DataCollatorForLanguageModeling(pad_token_id=tokenizer.pad_token_id or 0)
    optimizer = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=1e-4)

    def step(i: int, prof=None) -> tuple[dict, int, int]:
        """Collate, forward and backward (profiled when prof is given), optimizer; wall seconds of the unprofiled."""
        start = time.perf_counter()
        batch = collator(examples[i * per_step : (i + 1) * per_step])
        seconds = {"collation": time.perf_counter() - start}
        if prof:
            prof.start()
        if a.kind == "sft":
            loss, _ = lm_head.causal_lm_loss(model, batch, batch["labels"], unpad=unpad)
        else:  # DPO's passes: the reference (adapter off, no gradient), then the policy
            score = batch["labels"][:, 1:] != -100
            shared = score if unpad else None  # a pair's common prompt runs once
            with torch.no_grad(), model.disable_adapter():
                lm_head.scored_hidden(
                    model, score, unpad, shared, input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
                )
            hidden = lm_head.scored_hidden(
                model, score, unpad, shared, input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
            )
            out = lm_head.logprobs(hidden, lm_head.backbone_and_head(model)[1].weight, batch["input_ids"][:, 1:][score])
            loss = -out["log_probs"].mean()
        loss.backward()
        if prof:
            prof.stop()
        start = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad()
        seconds["optimizer"] = time.perf_counter() - start
        return seconds, int(batch["attention_mask"].sum()), batch["input_ids"].numel()

    for i in range(a.steps):
        step(i)
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True)
    start = time.perf_counter()
    spent, tokens, positions = step(a.steps, prof)
    wall = time.perf_counter() - start
    spent = defaultdict(float, spent)
    for event in prof.key_averages(group_by_input_shape=True):
        if event.key.startswith(("ProfilerStep", "autograd::engine")):
            continue
        spent[
            bucket(event.key, event.input_shapes, config.hidden_size, config.intermediate_size, config.vocab_size, 16)
        ] += event.self_cpu_time_total / 1e6
    total = sum(spent.values())
    print(
        f"{a.kind} step, batch {a.bs}, {'padded, torch dropout' if a.plain else 'unpadded, fast dropout'}: "
        f"{wall:.2f} s wall ({total:.2f} s of operator time), {tokens} real tokens in {positions} padded positions, "
        f"{torch.get_num_threads()} threads"
    )
    print("| part | seconds | share |\n|---|---|---|")
    for part, seconds in sorted(spent.items(), key=lambda kv: -kv[1]):
        print(f"| {part} | {seconds:.3f} | {seconds / total:.0%} |")


def sampling_table(model, tokenizer, tokens: int = 32) -> None:
    """Seconds for GRPO's generate() on 8 completions of one prompt (and more rows), lever by lever."""
    from transformers import GenerationConfig

    from dragon_dagster.engine.infer import decode_weights
    from dragon_dagster.engine.train import rollout

    tokenizer.padding_side = "left"
    questions = [f"What is {100 + i} + {200 + 3 * i}? Reply with just the number." for i in range(4)]
    prompts = [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
        for q in questions
    ]

    def timed(label: str, groups: int = 1, grouped: bool = False, train: bool = True, **config) -> None:
        rows = tokenizer([q for q in prompts[:groups] for _ in range(8)], return_tensors="pt", padding=True)
        settings = dict(
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=tokens,
            min_new_tokens=tokens,
            pad_token_id=tokenizer.pad_token_id,
        )
        generation = GenerationConfig(**{**settings, **config})
        model.train(train)
        best = float("inf")
        for _ in range(2):
            start = time.perf_counter()
            with torch.no_grad(), rollout.sampling(model) if grouped else contextlib.nullcontext():
                model.generate(**rows, generation_config=generation)
            best = min(best, time.perf_counter() - start)
        print(f"| {label} | {8 * groups} | {best:.2f} | {best / groups:.2f} |", flush=True)

    print(f"GRPO sampling, {tokens} tokens per completion, {torch.get_num_threads()} threads (best of 2)")
    print("| sampling | completions | seconds | per 8 completions |\n|---|---|---|---|")
    timed("TRL's generate: train mode (LoRA dropout on every token)")
    timed("eval mode (no dropout)", train=False)
    timed("train mode, top-k 50 before sampling", top_k=50)
    timed("train mode, static cache", cache_implementation="static")
    with model.disable_adapter():
        timed("eval mode, adapter off (the cost of LoRA's extra matmuls)", train=False)
    real_prepared, real_packable = decode_weights.prepared, decode_weights.packable
    decode_weights.prepared = lambda model, rows: contextlib.nullcontext()
    timed("rollout.sample without decode_weights: eval mode, prompt prefilled once, inverse-CDF draw", grouped=True)
    decode_weights.prepared, decode_weights.packable = real_prepared, lambda rows: False
    timed("rollout.sample, LoRA folded into the weights, torch's matmul", grouped=True)
    decode_weights.packable = real_packable
    timed("rollout.sample: LoRA folded, weights packed by oneDNN (the default)", grouped=True)
    timed("rollout.sample, 2 prompts at once", groups=2, grouped=True)
    timed("rollout.sample, 4 prompts at once", groups=4, grouped=True)


def grpo_phases(plain: bool, steps: int) -> None:
    """Seconds per on-policy GRPO step by phase, from timers on the worker's trainer, averaged over the steps
    after the first 3 but the last."""
    import compare_trl

    from dragon_dagster.engine.models import embedded_model_dir
    from dragon_dagster.engine.runtime import worker
    from dragon_dagster.engine.stages.grpo import trainer as grpo

    spent: dict[str, list[float]] = defaultdict(list)
    trainer = grpo.grpo_trainer()

    def timer(name: str, label) -> None:
        inner = getattr(trainer, name)

        def timed(self, *args, **kwargs):
            start = time.perf_counter()
            try:
                return inner(self, *args, **kwargs)
            finally:
                spent[label if isinstance(label, str) else label()].append(time.perf_counter() - start)

        setattr(trainer, name, timed)

    timer("_generate_single_turn", "sampling (generate)")
    timer(
        "_get_per_token_logps_and_entropies",
        lambda: "policy log-probs (forward)" if torch.is_grad_enabled() else "reference log-probs (no grad)",
    )
    timer("_generate_and_score_completions", "sampling and scoring, in all")
    timer("compute_loss", "forward and loss, in all")
    timer("training_step", "training step (no optimizer)")
    starts: list[float] = []  # each step's start: a step's wall time runs to the next one's
    inner_step = trainer.training_step

    def started(self, *args, **kwargs):
        starts.append(time.perf_counter())
        return inner_step(self, *args, **kwargs)

    trainer.training_step = started
    speed = {"loss_kernel": "trl", "unpad": "off", "dropout_mask": "torch", "sampling": "trl"} if plain else {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = random_model("smol", embedded_model_dir(), work / "smol")
        train = compare_trl.write_jsonl(
            work / "prompts.jsonl", compare_trl.grpo_rows(8 * (steps + 2), random.Random(0))
        )
        (work / "w").mkdir()
        job = compare_trl.engine_job(
            "grpo",
            model,
            train,
            work / "w",
            {"max_steps": steps, "batch_size": 1, "learning_rate": 1e-5},
            speed,
            dropout=0.05,  # the profiles in RESULTS were taken with the old peer's LoRA dropout
            rewards=[{"type": "numeric", "weight": 1.0}, {"type": "length", "max_chars": 12, "weight": 1.0}],
            group_size=8,
            beta=0.04,
            temperature=1.0,
            max_eval_prompts=2,
            max_new_tokens=32,
        )
        worker.main([str(job)])
    step_s = (starts[-1] - starts[3]) / (len(starts) - 4)
    per_step = {label: statistics.mean(values[3:-1]) for label, values in spent.items()}  # the same steps
    sampling, reference = per_step["sampling (generate)"], per_step.get("reference log-probs (no grad)", 0.0)
    policy, scoring = per_step["policy log-probs (forward)"], per_step["sampling and scoring, in all"]
    rows = {
        "sampling (generate)": sampling,
        "reference log-probs (no grad)": reference,
        "rewards, advantages, other scoring": scoring - sampling - reference,
        "policy forward and loss": per_step["forward and loss, in all"],
        "backward": per_step["training step (no optimizer)"] - scoring - per_step["forward and loss, in all"],
        "optimizer, logging, the rest": step_s - per_step["training step (no optimizer)"],
    }
    print(
        f"GRPO step, 8 completions x 32 tokens, {'TRL paths' if plain else 'this project CPU defaults'}: "
        f"{step_s:.2f} s per step ({torch.get_num_threads()} threads); policy log-probs {policy:.2f} s of the forward"
    )
    print("| phase | seconds | share |\n|---|---|---|")
    for label, seconds in rows.items():
        print(f"| {label} | {seconds:.2f} | {seconds / step_s:.0%} |")


if __name__ == "__main__":
    main()
