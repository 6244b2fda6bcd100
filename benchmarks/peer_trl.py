"""The peer: plain TRL 1.16 as its documentation shows it, with the options a knowledgeable user turns on.

One process trains one method on a saved model and a rows file that compare_trl.py also hands this project's
worker, and prints one JSON line. Nothing from dragon_dagster is imported: this is what a user writes with TRL.

    python benchmarks/peer_trl.py --method sft --model DIR --rows sft.jsonl --steps 8 --bs 4 --padding-free

The rows are conversational: SFT and KTO {"prompt": [...], "completion": [...]} (KTO with "label"), DPO and ORPO
{"prompt", "chosen", "rejected"}, GRPO {"prompt", "reference"}. With prompt-completion rows TRL's SFTTrainer
trains on the reply only (completion_only_loss), as this project's SFT does.

The options (each off unless given) are the ones TRL and transformers document for speed:
--gc 1 (gradient checkpointing, TRL's default; off here because it trades time for memory), --padding-free,
--packing (bfd, which is padding-free too), --torch-compile, --workers N (DataLoader workers),
--precompute-ref (DPO/KTO: the reference log-probabilities in one pass before training),
--steps-per-generation K (GRPO: one sampling round serves K steps; off-policy for the later ones).

Timing is the median seconds between consecutive logged steps after the first --skip steps (GRPO: the mean).
Work TRL does before the first step (precomputing reference log-probabilities, in the trainer's constructor) is
reported as `setup_s` and, spread over the steps, in `step_s_with_setup`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import datasets
import pyarrow as pa
import torch
from datasets import Dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback


class Timer(TrainerCallback):
    """Wall time, TRL's cumulative num_tokens and the loss at every logged step."""

    def __init__(self):
        self.rows: list[tuple[float, float, float | None]] = []

    def on_log(self, args, state, control, logs=None, **kw):
        if logs and ("loss" in logs or "num_tokens" in logs):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.rows.append((time.perf_counter(), float(logs.get("num_tokens", 0.0)), logs.get("loss")))


def numeric(completions, reference, **kw):
    """1 when the reply contains the reference number (this project's `numeric` reward, as a user writes it)."""
    return [1.0 if ref in c[0]["content"] else 0.0 for c, ref in zip(completions, reference)]


def length(completions, **kw):
    """1 when the reply is at most 12 characters (this project's `length` reward with max_chars 12)."""
    return [1.0 if len(c[0]["content"]) <= 12 else 0.0 for c in completions]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--method", required=True, choices=["sft", "dpo", "orpo", "kto", "grpo"])
    p.add_argument("--model", required=True)
    p.add_argument("--rows", required=True)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--bs", type=int, default=4, help="rows per step (GRPO: completions per step)")
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--lora-dropout", type=float, default=0.0)
    p.add_argument("--max-length", type=int, default=1024)
    p.add_argument("--comp", type=int, default=32, help="GRPO: max completion tokens")
    p.add_argument("--num-generations", type=int, default=8)
    p.add_argument("--beta", type=float, default=None)
    p.add_argument("--skip", type=int, default=3, help="logged steps left out of the timing (warm-up)")
    p.add_argument("--gc", type=int, default=0)
    p.add_argument("--padding-free", action="store_true")
    p.add_argument("--packing", action="store_true")
    p.add_argument("--torch-compile", action="store_true")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--precompute-ref", action="store_true")
    p.add_argument("--steps-per-generation", type=int, default=None)
    a = p.parse_args()
    datasets.disable_caching()
    cuda = torch.cuda.is_available()

    tok = AutoTokenizer.from_pretrained(a.model)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    rows = [json.loads(line) for line in open(a.rows)]
    # an explicit fingerprint skips hashing the table (slow, and fragile with some dill/pyarrow pairs)
    ds = Dataset(pa.Table.from_pylist(rows), fingerprint=f"{a.method}-rows")
    lora = LoraConfig(
        r=16, lora_alpha=32, lora_dropout=a.lora_dropout, target_modules="all-linear", task_type="CAUSAL_LM"
    )
    common = dict(
        output_dir="/tmp/peer_trl_out",
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        bf16=cuda,
        max_steps=a.steps,
        disable_tqdm=True,
        gradient_checkpointing=bool(a.gc),
        torch_compile=a.torch_compile,
        dataloader_num_workers=a.workers,
        seed=42,
        warmup_steps=0,
    )
    torch.manual_seed(0)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16 if cuda else torch.float32)
    timer = Timer()
    built = time.perf_counter()  # TRL precomputes reference log-probabilities while the trainer is built
    beta = a.beta if a.beta is not None else (0.04 if a.method == "grpo" else 0.1)
    if a.method == "sft":
        from trl import SFTConfig, SFTTrainer

        cfg = SFTConfig(
            per_device_train_batch_size=a.bs,
            # padding-free without packing does not truncate, and TRL asks for max_length=None to say so (these
            # rows are all far shorter than --max-length)
            max_length=None if a.padding_free and not a.packing else a.max_length,
            packing=a.packing,
            packing_strategy="bfd",
            padding_free=a.padding_free,
            learning_rate=a.lr or 2e-4,
            **common,
        )
        trainer = SFTTrainer(
            model=model, args=cfg, train_dataset=ds, processing_class=tok, peft_config=lora, callbacks=[timer]
        )
    elif a.method == "dpo":
        from trl import DPOConfig, DPOTrainer

        cfg = DPOConfig(
            per_device_train_batch_size=a.bs,
            max_length=a.max_length,
            learning_rate=a.lr or 5e-5,
            beta=beta,
            precompute_ref_log_probs=a.precompute_ref,
            **common,
        )
        trainer = DPOTrainer(
            model=model, args=cfg, train_dataset=ds, processing_class=tok, peft_config=lora, callbacks=[timer]
        )
    elif a.method == "orpo":
        from trl.experimental.orpo import ORPOConfig, ORPOTrainer

        cfg = ORPOConfig(
            per_device_train_batch_size=a.bs, max_length=a.max_length, learning_rate=a.lr or 5e-5, beta=beta, **common
        )
        trainer = ORPOTrainer(
            model=model, args=cfg, train_dataset=ds, processing_class=tok, peft_config=lora, callbacks=[timer]
        )
    elif a.method == "kto":
        from trl import KTOConfig, KTOTrainer

        cfg = KTOConfig(
            per_device_train_batch_size=a.bs,
            max_length=a.max_length,
            learning_rate=a.lr or 5e-5,
            beta=beta,
            precompute_ref_log_probs=a.precompute_ref,
            **common,
        )
        # KTO reads its batches in order (each reply's KL term pairs it with another prompt of the batch), so the
        # rows are shuffled once, as TRL's docs advise and as this project's kto stage does (seed 42)
        trainer = KTOTrainer(
            model=model,
            args=cfg,
            train_dataset=ds.shuffle(seed=42),
            processing_class=tok,
            peft_config=lora,
            callbacks=[timer],
        )
    else:
        from trl import GRPOConfig, GRPOTrainer

        cfg = GRPOConfig(
            per_device_train_batch_size=a.bs,
            num_generations=a.num_generations,
            max_completion_length=a.comp,
            beta=beta,
            learning_rate=a.lr or 1e-5,
            temperature=1.0,
            steps_per_generation=a.steps_per_generation,
            **common,
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=[numeric, length],
            args=cfg,
            train_dataset=ds,
            processing_class=tok,
            peft_config=lora,
            callbacks=[timer],
        )
    start = time.perf_counter()
    build_s = start - built
    trainer.train()
    wall = time.perf_counter() - start

    times = [t for t, _, _ in timer.rows]
    gaps = [later - before for before, later in zip(times, times[1:])]
    timed = gaps[a.skip :] if len(gaps) > a.skip else gaps
    # GRPO: the mean step, as compare_trl times ours, so that a window of whole sampling rounds counts each round's
    # sampling step once (with steps_per_generation 4 the median would be a step that samples nothing)
    step_s = statistics.mean(timed) if a.method == "grpo" else statistics.median(timed)
    # what ran before the first logged step beyond a step's own time: loading the data, precomputing references
    # precompute_ref runs in the trainer's constructor (with the rows' tokenization, a second or two here): charged
    setup_s = max(0.0, times[0] - start - step_s) + (build_s if a.precompute_ref else 0.0)
    tokens = [n for _, n, _ in timer.rows]
    span = times[-1] - times[a.skip] if len(times) > a.skip + 1 else times[-1] - times[0]
    token_span = tokens[-1] - tokens[a.skip] if len(tokens) > a.skip + 1 else tokens[-1] - tokens[0]
    out = dict(
        method=a.method,
        step_s=step_s,
        step_s_with_setup=step_s + (setup_s if a.precompute_ref else 0.0) / a.steps,
        setup_s=setup_s,
        build_s=build_s,
        tokens_per_s=token_span / span if span and token_span else None,
        losses=[loss for _, _, loss in timer.rows],
        steps_logged=len(timer.rows),
        wall_s=wall,
        options={
            k: getattr(a, k)
            for k in ("gc", "padding_free", "packing", "torch_compile", "workers", "precompute_ref")
            if getattr(a, k)
        }
        | ({"steps_per_generation": a.steps_per_generation} if a.steps_per_generation else {})
        | {"lora_dropout": a.lora_dropout},
    )
    if a.method == "grpo":
        logs = [h for h in trainer.state.log_history if "completions/mean_length" in h]
        out["mean_completion_len"] = statistics.mean(h["completions/mean_length"] for h in logs) if logs else None
    if cuda:
        out["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
