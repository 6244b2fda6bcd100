"""The reward_model kind's worker: TRL's RewardConfig and RewardTrainer on the base model as a sequence classifier
(a LoRA adapter plus the scalar `score` head, both saved in adapter/), then the held-out pairs scored by the saved
model as a GRPO stage will load it: accuracy, margin, the scores' spread and their histogram."""

from __future__ import annotations

import json
from pathlib import Path
from statistics import mean, pstdev

from ...artifacts import progress
from ...config.reporter import Reporter
from ...evaluate.plots import plot_loss, plot_reward_scores
from ...infer.reward_model import RewardScorer, load_scorer
from ...models import load_tokenizer, pick_device, pick_dtype
from ...train import distributed, held_out
from ...train.preference import check_rows
from ...train.trainer import TrainingError, TrainingJob, lora_config, progress_callback, rows_for_steps, run_trainer
from ...train.trl_config import TrainerRun
from .result import RewardModelResult
from .trl_config import to_trl_config

PROGRESS_COLUMNS = {"accuracy": "rm_accuracy", "margin": "rm_margin", "mean_reward": "mean_score"}


def load_classifier(path: str, hardware):
    import torch
    from transformers import AutoModelForSequenceClassification

    device = pick_device(hardware)
    torch.manual_seed(0)  # the fresh score head: the same start for the same seed
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, dtype=pick_dtype(hardware, device))
    return model.to(device)


def pair_scores(scorer: RewardScorer, rows: list[dict]) -> tuple[list[float], list[float]]:
    prompts = [r["prompt"] for r in rows]
    chosen = scorer.score(prompts, [r["chosen"][-1]["content"] for r in rows])
    rejected = scorer.score(prompts, [r["rejected"][-1]["content"] for r in rows])
    return chosen, rejected


def ranking_figures(chosen: list[float], rejected: list[float]) -> dict:
    if not chosen:
        return {}
    every = chosen + rejected
    return {
        "accuracy": mean(c > r for c, r in zip(chosen, rejected)),
        "margin": mean(c - r for c, r in zip(chosen, rejected)),
        "chosen_mean": mean(chosen),
        "rejected_mean": mean(rejected),
        "score_mean": mean(every),
        "score_std": pstdev(every),
    }


def train_reward_model(job: TrainingJob, reporter: Reporter) -> RewardModelResult | None:
    from datasets import Dataset
    from trl import RewardTrainer

    from ...data.tables import read_jsonl

    settings, inputs, out = job.settings, job.inputs, Path(job.output_dir)
    if inputs.adapters:  # the pipeline never chains one; a job that does was not made by it
        raise TrainingError("a reward model starts from the base model: its job must carry no adapters")
    train_rows = read_jsonl(inputs.train_file)
    eval_rows = read_jsonl(inputs.eval_file) if inputs.eval_file and Path(inputs.eval_file).exists() else []
    eval_total = len(eval_rows)
    eval_rows = held_out.sample_rows(eval_rows, settings.args.max_eval_rows, settings.args.seed)
    if not train_rows:
        raise TrainingError(f"no training pairs in {inputs.train_file}")
    check_rows(settings, train_rows + eval_rows)
    columns = ("prompt", "chosen", "rejected")
    tokenizer = load_tokenizer(inputs.model)
    distributed.bind_device()
    model = load_classifier(inputs.model, job.hardware)
    callback = progress_callback(reporter, out, columns=PROGRESS_COLUMNS)
    config = to_trl_config(settings, TrainerRun(job.hardware, inputs.checkpoint_dir, workers=distributed.world_size()))

    def pairs(rows: list[dict]):
        return Dataset.from_list([{k: r[k] for k in columns} for r in rows])

    trainer = RewardTrainer(
        model=model,
        args=config,
        train_dataset=pairs(rows_for_steps(train_rows, settings.args, reporter)),  # those max_steps reaches
        eval_dataset=held_out.eval_dataset(eval_rows, settings.args, pairs),  # eval_accuracy, eval_margin
        processing_class=tokenizer,
        peft_config=lora_config(settings.lora, "SEQ_CLS", modules_to_save=["score"]),
        callbacks=[callback, *held_out.callbacks(settings.args)],
    )
    result = run_trainer(trainer, callback, job, reporter)
    if not distributed.is_main():
        return None
    logged = progress.read(out)
    losses = [r["loss"] for r in logged if isinstance(r.get("loss"), (int, float))]
    accuracies = [r["rm_accuracy"] for r in logged if isinstance(r.get("rm_accuracy"), (int, float))]
    # scored by the saved adapter, loaded as every user of it loads it: what it was saved as is what is measured
    scorer = load_scorer(inputs.model, out / "adapter", job.hardware, max_length=settings.args.max_seq_len)
    chosen, rejected = pair_scores(scorer, eval_rows)
    figures = ranking_figures(chosen, rejected)
    if eval_rows:
        reporter.log(
            f"held-out: {figures['accuracy']:.0%} of {len(eval_rows)} pairs ranked right, "
            f"mean margin {figures['margin']:.3f}"
        )
    summary = RewardModelResult(
        objective=settings.objective(),
        loss_label="reward model loss (pairwise)",
        global_step=trainer.state.global_step,
        train_loss=result.training_loss,
        first_loss=losses[0] if losses else None,
        last_loss=losses[-1] if losses else None,
        held_out=bool(eval_rows),
        eval_pairs=len(eval_rows),
        train_pairs=len(train_rows),
        train_accuracy=accuracies[-1] if accuracies else None,
        kept=held_out.kept_adapter(trainer, settings.args),
        held_out_rows=held_out.held_out_rows(len(eval_rows), eval_total),
        **figures,
    )
    with (out / "samples.jsonl").open("w") as f:
        for row, c, r in list(zip(eval_rows, chosen, rejected))[: settings.n_samples]:
            record = {
                "prompt": row["prompt"][-1]["content"],
                "chosen": row["chosen"][-1]["content"],
                "rejected": row["rejected"][-1]["content"],
                "score_chosen": c,
                "score_rejected": r,
            }
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    (out / "metrics.json").write_text(summary.model_dump_json(indent=2))
    plot_loss(logged, out / "loss.png", title="reward model loss and training accuracy", extra="rm_accuracy")
    plot_reward_scores(chosen, rejected, out / "scores.png", f"{settings.name}: held-out scores")
    final = {f"eval/rm_{k}": v for k, v in figures.items()}
    reporter.metrics(trainer.state.global_step, final)
    return summary
