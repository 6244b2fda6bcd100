"""The sft kind's worker: supervised fine-tuning with TRL's SFTTrainer and a PEFT LoRA adapter.

Rows are conversational prompt-completion examples. By default (train_on final_turn) TRL computes loss on the
final assistant turn only (completion_only_loss), which works with any chat template. train_on
all_assistant_turns trains every assistant turn (assistant_only_loss) through a template with `{% generation %}`
marks; turns.py prepares the template and the rows for either.
"""

from __future__ import annotations

import json
from pathlib import Path

from ...artifacts import progress
from ...config.reporter import Reporter
from ...evaluate.plots import plot_loss
from ...evaluate.replies import eval_metrics, evaluate_rows
from ...tools.declare import Toolset, with_tools
from ...train import distributed, lm_head
from ...train.held_out import callbacks, eval_dataset, held_out_rows, kept_adapter
from ...train.trainer import (
    TrainingJob,
    apply_speed,
    lora_config,
    prepare,
    progress_callback,
    rows_for_steps,
    run_trainer,
)
from ...train.trl_config import TrainerRun
from . import turns
from .result import SFTResult
from .trainer import chunked_loss_trainer, resumable_trainer
from .trl_config import to_trl_config


def train_sft(job: TrainingJob, reporter: Reporter) -> SFTResult | None:
    train_on = job.settings.train_on
    pipeline_tools = Toolset.from_input(job.inputs.tools)

    def ready(tokenizer, rows):  # the pipeline's tools are in every conversation, as chat and evaluation show them
        if pipeline_tools is not None:
            with_tools(rows, pipeline_tools.schemas)
        return turns.prepare_template(tokenizer, rows, train_on)

    p = prepare(job, template=ready)
    reporter.log(f"loss on {train_on.replace('_', ' ')}; chat template rendering: {p.rendering}")
    chunked = lm_head.use_chunked(p.speed, p.model, p.lora.peft_target_modules(), reporter)
    config = to_trl_config(job.settings, TrainerRun.of(job, p.speed, compiled_here=chunked, workers=p.workers))
    callback = progress_callback(reporter, Path(job.output_dir))
    # packed, a step takes as many rows as fill its sequences: no count to bound them by
    if p.speed.packing != "on":
        p.reached_rows = rows_for_steps(p.train_rows, p.args, reporter)
    trainer = (chunked_loss_trainer() if chunked else resumable_trainer())(
        model=p.model,
        args=config,
        train_dataset=turns.training_dataset(p.trained_rows, train_on),
        eval_dataset=eval_dataset(p.eval_rows, p.args, lambda rows: turns.training_dataset(rows, train_on)),
        processing_class=p.tokenizer,
        peft_config=lora_config(p.lora),
        callbacks=[callback, *callbacks(p.args)],
    )
    speed = apply_speed(trainer, p.speed, chunked, reporter)
    trainer.unpad = speed["unpad"]
    reporter.log(f"speed: packing {p.speed.packing}" + (", torch.compile" if p.speed.torch_compile else ""))
    result = run_trainer(trainer, callback, job, reporter)
    if not distributed.is_main():  # rank 0 evaluates and writes the artifact
        return None
    rows = p.eval_rows or p.train_rows[: job.settings.n_samples]
    speed = {"packing": p.speed.packing, "torch_compile": p.speed.torch_compile, **speed}
    out = Path(job.output_dir)
    held = bool(p.eval_rows)
    return summarize(trainer, result, p.tokenizer, rows, held, job, speed, out, reporter, p.rendering, p.eval_total)


def summarize(
    trainer,
    result,
    tokenizer,
    rows,
    held_out: bool,
    job,
    speed: dict,
    out: Path,
    reporter,
    rendering: str = "none",
    eval_total: int = 0,
) -> SFTResult:
    """Held-out loss, perplexity, samples and task metrics for the trained adapter; written into out."""
    counted = held_out_rows(len(rows), eval_total) if held_out else None
    reporter.log(
        f"evaluating on {counted.sentence() if counted else len(rows)} {'held-out' if held_out else 'training'} rows"
    )
    model = trainer.model
    model.eval()
    evaluation = evaluate_rows(
        model,
        tokenizer,
        rows,
        n_samples=job.settings.n_samples,
        max_new_tokens=job.settings.max_new_tokens,
        max_len=job.settings.args.max_seq_len,
        metric_names=job.settings.metrics,
    )
    n_metric_rows = min(job.settings.n_samples, len(rows))
    split = "held-out" if held_out else "training"
    rows_logged = progress.read(out)
    losses = [r["loss"] for r in rows_logged if isinstance(r.get("loss"), (int, float))]
    summary = SFTResult(
        objective=job.settings.objective(),
        loss_label="SFT loss (reply NLL)",
        speed=speed,
        global_step=trainer.state.global_step,
        train_loss=result.training_loss,
        first_loss=losses[0] if losses else None,
        last_loss=losses[-1] if losses else None,
        train_runtime_s=result.metrics.get("train_runtime"),
        held_out=held_out,
        eval_loss=evaluation["eval_loss"] if held_out else None,
        perplexity=evaluation["perplexity"] if held_out else None,
        eval_tokens=evaluation["eval_tokens"] if held_out else 0,
        metrics=evaluation["metrics"],
        # the report measures all held-out rows; these metrics are on the first n_samples of them
        computed_on=f"n_samples={n_metric_rows} {split} rows",
        metrics_chosen_by="pipeline" if job.settings.metrics else "references",
        train_on=job.settings.train_on,
        rendering=rendering,
        kept=kept_adapter(trainer, job.settings.args),
        held_out_rows=counted,
    )
    with (out / "samples.jsonl").open("w") as f:
        for sample in evaluation["samples"]:
            f.write(json.dumps(sample, ensure_ascii=False) + "\n")
    (out / "metrics.json").write_text(summary.model_dump_json(indent=2))
    plot_loss(rows_logged, out / "loss.png", title="SFT training loss")
    reporter.metrics(trainer.state.global_step, eval_metrics(summary.model_dump()))
    return summary
