"""Preference optimization: DPO (TRL's DPOTrainer) or ORPO (trl.experimental.orpo) on a LoRA adapter.

With PEFT, DPO needs no separate reference model: the policy with its adapter switched off is the
reference, which is the model the stage started from (earlier adapters already folded in).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from . import progress
from .. import distributed
from ..evaluate.replies import generate
from ..reporter import Reporter
from ..spec.stages import Preference
from .trainer import StageJob, common_args, lora_config, prepare, progress_callback, run_trainer

@dataclass
class PreferenceJob(StageJob):
    settings: Preference


def build_trainer(job: PreferenceJob, p, callback):
    from datasets import Dataset

    kwargs = dict(common_args(p.args, p.hardware, job.checkpoint_dir, p.speed, workers=p.workers),
                  beta=job.settings.beta, max_length=p.args.max_seq_len)
    train = Dataset.from_list(p.train_rows)
    evals = Dataset.from_list(p.eval_rows) if p.eval_rows else None
    if job.settings.method == "orpo":
        from trl.experimental.orpo import ORPOConfig, ORPOTrainer

        return ORPOTrainer(model=p.model, args=ORPOConfig(**kwargs), train_dataset=train, eval_dataset=evals,
                           processing_class=p.tokenizer, peft_config=lora_config(p.lora), callbacks=[callback])
    from trl import DPOConfig, DPOTrainer

    return DPOTrainer(model=p.model, ref_model=None, args=DPOConfig(**kwargs), train_dataset=train,
                      eval_dataset=evals, processing_class=p.tokenizer, peft_config=lora_config(p.lora),
                      callbacks=[callback])


def train_preference(job: PreferenceJob, reporter: Reporter) -> dict:
    p = prepare(job)
    out = Path(job.output_dir)
    callback = progress_callback(reporter, out)
    trainer = build_trainer(job, p, callback)
    result = run_trainer(trainer, callback, job, reporter)
    summary = {"method": job.settings.method, "beta": job.settings.beta, "global_step": trainer.state.global_step,
               "train_loss": result.training_loss, "held_out": bool(p.eval_rows), "eval_pairs": len(p.eval_rows)}
    logged = progress.read(out)
    losses = [r["loss"] for r in logged if isinstance(r.get("loss"), (int, float))]
    summary.update(first_loss=losses[0] if losses else None, last_loss=losses[-1] if losses else None)
    if p.eval_rows:  # every rank: the evaluation is sharded across them
        reporter.log(f"evaluating preference accuracy on {len(p.eval_rows)} held-out pairs")
        figures = trainer.evaluate()
        summary.update(pref_accuracy=figures.get("eval_rewards/accuracies"),
                       reward_margin=figures.get("eval_rewards/margins"),
                       preference_loss=figures.get("eval_loss"))  # the DPO/ORPO objective, not a language-model NLL
    if not distributed.is_main():  # rank 0 samples and writes the artifact
        return {**summary, "rank": distributed.rank()}
    rows = (p.eval_rows or p.train_rows)[: job.settings.n_samples]
    trainer.model.eval()
    replies = generate(trainer.model, p.tokenizer, [r["prompt"] for r in rows], max_new_tokens=job.settings.max_new_tokens)
    with (out / "samples.jsonl").open("w") as f:
        for row, reply in zip(rows, replies):
            f.write(json.dumps({"prompt": row["prompt"][-1]["content"], "chosen": row["chosen"][-1]["content"],
                                "rejected": row["rejected"][-1]["content"], "generated": reply},
                               ensure_ascii=False) + "\n")
    (out / "metrics.json").write_text(json.dumps(summary, indent=2))
    progress.plot_loss(logged, out / "loss.png", title=f"{job.settings.method.upper()} training loss")
    final = {"eval/pref_accuracy": summary.get("pref_accuracy"), "eval/reward_margin": summary.get("reward_margin"),
             f"eval/{job.settings.method}_loss": summary.get("preference_loss")}
    reporter.metrics(trainer.state.global_step, {k: v for k, v in final.items() if v is not None})
    return summary
