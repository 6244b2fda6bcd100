"""Supervised fine-tuning with TRL's SFTTrainer and a PEFT LoRA adapter.

Rows are conversational prompt-completion examples, so TRL computes loss on the final assistant turn only
(completion_only_loss): this works with any chat template, SmolLM2's included, which has no
`{% generation %}` markers for assistant_only_loss.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from .. import distributed
from ..evaluate.replies import eval_metrics, evaluate_rows
from ..reporter import Reporter
from ..spec.settings import Hardware
from ..spec.stages import TrainArgs
from . import progress
from .trainer import (
    Cancelled,
    StageJob,
    TrainingError,
    apply_speed,
    common_args,
    last_checkpoint,
    lora_config,
    prepare,
    progress_callback,
    run_trainer,
)

__all__ = [
    "SFTJob",
    "train_sft",
    "Cancelled",
    "TrainingError",
    "last_checkpoint",
    "common_args",
    "Hardware",
    "TrainArgs",
]


@dataclass
class SFTJob(StageJob):
    pass


def train_sft(job: SFTJob, reporter: Reporter) -> dict:
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from . import lm_head

    p = prepare(job)
    chunked = lm_head.use_chunked(p.speed, p.model, p.lora.peft_target_modules(), reporter)
    args = common_args(p.args, p.hardware, job.checkpoint_dir, p.speed, compiled_here=chunked, workers=p.workers)
    config = SFTConfig(
        **args,
        max_length=p.args.max_seq_len,
        completion_only_loss=True,
        packing=p.speed.packing == "on",
        packing_strategy="bfd",
    )
    callback = progress_callback(reporter, Path(job.output_dir))
    trainer = (chunked_loss_trainer() if chunked else SFTTrainer)(
        model=p.model,
        args=config,
        train_dataset=Dataset.from_list(p.train_rows),
        processing_class=p.tokenizer,
        peft_config=lora_config(p.lora),
        callbacks=[callback],
    )
    speed = apply_speed(trainer, p.speed, chunked, reporter)
    trainer.unpad = speed["unpad"]
    reporter.log(f"speed: packing {p.speed.packing}" + (", torch.compile" if p.speed.torch_compile else ""))
    result = run_trainer(trainer, callback, job, reporter)
    if not distributed.is_main():  # rank 0 evaluates and writes the artifact
        return {"global_step": trainer.state.global_step, "rank": distributed.rank()}
    rows = p.eval_rows or p.train_rows[: job.settings.n_samples]
    summary = summarize(
        trainer, result, p.tokenizer, rows, bool(p.eval_rows), job, p.args, Path(job.output_dir), reporter
    )
    return {**summary, "speed": {"packing": p.speed.packing, "torch_compile": p.speed.torch_compile, **speed}}


@functools.cache
def chunked_loss_trainer():
    """The class, built on first use so that importing this module does not import TRL or torch."""
    from trl import SFTTrainer

    from . import lm_head

    class ChunkedLossSFTTrainer(SFTTrainer):
        """SFTTrainer whose training loss comes from lm_head: the same loss, a fraction of the head's cost.

        It logs what TRL logs (num_tokens, mean_token_accuracy) except entropy, which would cost another pass
        over the vocabulary. With unpad the backbone runs over the real tokens only.
        """

        unpad = False

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            plain_nll = (
                self.args.loss_type == "nll"
                and self.compute_loss_func is None
                and self.label_smoother is None
                and not self.aux_loss_enabled
            )
            if return_outputs or not model.training or not plain_nll:
                return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            labels = inputs["labels"]
            # through the DDP wrapper's forward when there is one: that is what makes its backward all-reduce
            loss, counts = lm_head.through_wrapper(
                model, lm_head.causal_lm_loss, inputs, labels, num_items_in_batch, self.unpad
            )
            if self.args.average_tokens_across_devices and num_items_in_batch is not None:
                loss = loss * self.accelerator.num_processes
            seen = inputs["attention_mask"].sum() if "attention_mask" in inputs else inputs["position_ids"].size(1)
            correct, tokens, seen = self.count_all_ranks(
                counts["correct"], counts["tokens"], int(seen), device=loss.device
            )
            self._metrics["train"]["mean_token_accuracy"].append(correct / max(tokens, 1))
            self._total_train_tokens += seen
            self._metrics["train"]["num_tokens"] = [self._total_train_tokens]
            return loss

        def count_all_ranks(self, *counts: int, device) -> list[int]:
            """The counts summed over the data-parallel ranks, as TRL's figures are (one small all-reduce)."""
            if self.accelerator.num_processes == 1:
                return list(counts)
            import torch

            return [int(v) for v in self.accelerator.reduce(torch.tensor(counts, device=device), "sum").tolist()]

    return ChunkedLossSFTTrainer


def summarize(trainer, result, tokenizer, rows, held_out: bool, job, args: TrainArgs, out: Path, reporter) -> dict:
    """Held-out loss, perplexity, samples and task metrics for the trained adapter; written into out."""
    reporter.log(f"evaluating on {len(rows)} {'held-out' if held_out else 'training'} rows")
    model = trainer.model
    model.eval()
    evaluation = evaluate_rows(
        model,
        tokenizer,
        rows,
        n_samples=job.settings.n_samples,
        max_new_tokens=job.settings.max_new_tokens,
        max_len=args.max_seq_len,
        metric_names=job.settings.metrics,
    )
    n_metric_rows = min(job.settings.n_samples, len(rows))
    split = "held-out" if held_out else "training"
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
        # the report measures all held-out rows; these metrics are on the first n_samples of them
        "computed_on": f"n_samples={n_metric_rows} {split} rows",
        "metrics_chosen_by": "pipeline" if job.settings.metrics else "references",
    }
    with (out / "samples.jsonl").open("w") as f:
        for sample in evaluation["samples"]:
            f.write(json.dumps(sample, ensure_ascii=False) + "\n")
    (out / "metrics.json").write_text(json.dumps(summary, indent=2))
    progress.plot_loss(rows_logged, out / "loss.png", title="SFT training loss")
    reporter.metrics(trainer.state.global_step, eval_metrics(summary))
    return summary
