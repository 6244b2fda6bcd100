"""Supervised fine-tuning with TRL's SFTTrainer and a PEFT LoRA adapter.

Rows are conversational prompt-completion examples, so TRL computes loss on the final assistant turn only
(completion_only_loss): this works with any chat template, SmolLM2's included, which has no
`{% generation %}` markers for assistant_only_loss.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import progress
from .data import read_jsonl
from .evaluate import evaluate_rows
from .models import load_model, load_tokenizer, pick_device, pick_dtype
from .reporting import Reporter
from .settings import Hardware, LoraSettings, TrainArgs, build


class TrainingError(RuntimeError):
    """Training could not go on: NaN loss, no data, a broken model."""


class Cancelled(RuntimeError):
    """Training stopped on request after saving a checkpoint."""


@dataclass
class SFTJob:
    model: str                       # resolved base model (directory or hub id)
    train_file: str
    output_dir: str                  # the adapter's artifact directory (staged)
    checkpoint_dir: str              # survives a cancel; resume reads it
    eval_file: str | None = None
    adapters: list[str] = field(default_factory=list)  # earlier stages, folded in first
    lora: dict = field(default_factory=dict)
    args: dict = field(default_factory=dict)
    hardware: dict = field(default_factory=dict)
    resume_from: str | None = None
    n_samples: int = 10
    max_new_tokens: int = 128


def last_checkpoint(checkpoint_dir: str | Path) -> Path | None:
    candidates = [p for p in Path(checkpoint_dir).glob("checkpoint-*") if p.name.split("-")[-1].isdigit()]
    return max(candidates, key=lambda p: int(p.name.split("-")[-1]), default=None)


def trainer_precision(hardware: Hardware) -> dict:
    """bf16/fp16 flags for the trainer; TRL defaults to bf16 even on a CPU, which we do not want there."""
    import torch

    device = pick_device(hardware)
    dtype = pick_dtype(hardware, device)
    return {"use_cpu": device == "cpu", "bf16": dtype == torch.bfloat16 and device != "cpu",
            "fp16": dtype == torch.float16 and device != "cpu"}


def lora_config(lora: LoraSettings):
    from peft import LoraConfig

    return LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                      target_modules=lora.peft_target_modules(), task_type="CAUSAL_LM")


def common_args(args: TrainArgs, hardware: Hardware, checkpoint_dir: str) -> dict:
    """Trainer arguments every stage shares, from dragon_train_args-style settings."""
    return dict(
        output_dir=checkpoint_dir, num_train_epochs=args.epochs, max_steps=args.max_steps or -1,
        per_device_train_batch_size=args.batch_size, gradient_accumulation_steps=args.grad_accum,
        learning_rate=args.learning_rate, warmup_steps=args.warmup_ratio, weight_decay=args.weight_decay,
        logging_steps=args.logging_steps, logging_first_step=True, save_strategy="steps",
        save_steps=args.save_steps, save_total_limit=2, gradient_checkpointing=args.gradient_checkpointing,
        seed=args.seed, report_to="none", logging_nan_inf_filter=False, **trainer_precision(hardware),
    )


def progress_callback(reporter: Reporter, out_dir: Path, prefix: str = "train"):
    """A TrainerCallback that streams step metrics, stops on NaN loss and honours cancel requests."""
    from transformers import TrainerCallback

    class ProgressCallback(TrainerCallback):
        def __init__(self):
            self.started = time.time()
            self.nan_step: int | None = None
            self.cancelled = False

        def on_log(self, args, state, control, logs=None, **kwargs):
            logs = dict(logs or {})
            loss = logs.get("loss")
            # logging_nan_inf_filter is off, so a NaN loss shows here; a NaN gradient norm is the same failure.
            if any(v is not None and not math.isfinite(v) for v in (loss, logs.get("grad_norm"))):
                self.nan_step = state.global_step
                control.should_training_stop = True
            elapsed = time.time() - self.started
            done = max(state.global_step, 1)
            eta = elapsed / done * max(state.max_steps - state.global_step, 0)
            row = {"step": state.global_step, "epoch": logs.get("epoch"), "loss": loss,
                   "lr": logs.get("learning_rate"), "grad_norm": logs.get("grad_norm"),
                   "elapsed_s": round(elapsed, 2), "eta_s": round(eta, 1)}
            row.update({k: v for k, v in logs.items() if k not in ("loss", "learning_rate", "grad_norm", "epoch")
                        and isinstance(v, (int, float))})
            progress.append(out_dir, row)
            metrics = {f"{prefix}/{k}": v for k, v in logs.items() if isinstance(v, (int, float))}
            reporter.metrics(state.global_step, metrics)
            shown = ", ".join(f"{k} {v:.4g}" for k, v in logs.items() if isinstance(v, (int, float)) and k != "epoch")
            reporter.log(f"step {state.global_step}/{state.max_steps} {shown} | elapsed {elapsed:.0f}s eta {eta:.0f}s")

        def on_step_end(self, args, state, control, **kwargs):
            if reporter.should_stop():
                self.cancelled = True
                control.should_save = True
                control.should_training_stop = True

    return ProgressCallback()


def quiet_progress_bar(trainer) -> None:
    """Keep transformers' tqdm bar but drop its printed log dicts: our callback reports each step once."""
    from transformers.trainer_callback import ProgressCallback

    class BarOnly(ProgressCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            pass

    if trainer.pop_callback(ProgressCallback) is not None:
        trainer.add_callback(BarOnly())


def finish_training(trainer, callback, checkpoint_dir: str, reporter: Reporter) -> None:
    """Raise for a NaN loss or a cancel; both keep the checkpoints already on disk."""
    if callback.nan_step is not None:
        raise TrainingError(f"loss became NaN or infinite at step {callback.nan_step}: lower the learning rate "
                            f"or check the data; checkpoints so far are kept in {checkpoint_dir}")
    if callback.cancelled:
        ckpt = last_checkpoint(checkpoint_dir)
        reporter.log(f"cancelled: checkpoint saved at {ckpt}; materialize again with resume: true to continue")
        raise Cancelled(f"training cancelled at step {trainer.state.global_step}; checkpoint {ckpt}")


def train_sft(job: SFTJob, reporter: Reporter) -> dict:
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    lora = build(LoraSettings, job.lora, "lora")
    args = build(TrainArgs, job.args, "args")
    hardware = build(Hardware, job.hardware, "hardware")
    out = Path(job.output_dir)
    train_rows = read_jsonl(job.train_file)
    eval_rows = read_jsonl(job.eval_file) if job.eval_file and Path(job.eval_file).exists() else []
    if not train_rows:
        raise TrainingError(f"no training rows in {job.train_file}")

    tokenizer = load_tokenizer(job.model)
    model = load_model(job.model, hardware, adapters=job.adapters, trainable=True)
    config = SFTConfig(**common_args(args, hardware, job.checkpoint_dir), max_length=args.max_seq_len,
                       completion_only_loss=True, dataset_num_proc=None)
    callback = progress_callback(reporter, out)
    trainer = SFTTrainer(model=model, args=config, train_dataset=Dataset.from_list(train_rows),
                         processing_class=tokenizer, peft_config=lora_config(lora), callbacks=[callback])
    quiet_progress_bar(trainer)
    reporter.log(f"training {len(train_rows)} rows for {trainer.args.max_steps if args.max_steps else args.epochs} "
                 f"{'steps' if args.max_steps else 'epochs'} on {model.device}"
                 + (f", resuming from {job.resume_from}" if job.resume_from else ""))
    result = trainer.train(resume_from_checkpoint=job.resume_from)
    finish_training(trainer, callback, job.checkpoint_dir, reporter)

    adapter_dir = out / "adapter"
    trainer.model.save_pretrained(adapter_dir)
    tokenizer.save_pretrained(adapter_dir)
    return summarize(trainer, result, tokenizer, eval_rows or train_rows[: job.n_samples], bool(eval_rows), job, args, out, reporter)


def summarize(trainer, result, tokenizer, rows, held_out: bool, job, args: TrainArgs, out: Path, reporter) -> dict:
    """Held-out loss, perplexity, samples and task metrics for the trained adapter; written into out."""
    reporter.log(f"evaluating on {len(rows)} {'held-out' if held_out else 'training'} rows")
    model = trainer.model
    model.eval()
    evaluation = evaluate_rows(model, tokenizer, rows, n_samples=job.n_samples, max_new_tokens=job.max_new_tokens,
                               max_len=args.max_seq_len)
    rows_logged = progress.read(out)
    losses = [r["loss"] for r in rows_logged if isinstance(r.get("loss"), (int, float))]
    summary = {
        "global_step": trainer.state.global_step,
        "train_loss": result.training_loss,
        "first_loss": losses[0] if losses else None,
        "last_loss": losses[-1] if losses else None,
        "train_runtime_s": result.metrics.get("train_runtime"),
        "held_out": held_out,
        "eval_loss": evaluation["eval_loss"] if held_out else None,
        "perplexity": evaluation["perplexity"] if held_out else None,
        "eval_tokens": evaluation["eval_tokens"] if held_out else 0,
        "metrics": evaluation["metrics"],
    }
    with (out / "samples.jsonl").open("w") as f:
        for sample in evaluation["samples"]:
            f.write(json.dumps(sample, ensure_ascii=False) + "\n")
    (out / "metrics.json").write_text(json.dumps(summary, indent=2))
    progress.plot_loss(rows_logged, out / "loss.png", title="SFT training loss")
    final = {"eval/loss": summary["eval_loss"], "eval/perplexity": summary["perplexity"]}
    final.update({f"eval/{k}": v for k, v in summary["metrics"].items()})
    reporter.metrics(trainer.state.global_step, {k: v for k, v in final.items() if v is not None})
    return summary


def cleanup_checkpoints(checkpoint_dir: str | Path) -> None:
    shutil.rmtree(checkpoint_dir, ignore_errors=True)
