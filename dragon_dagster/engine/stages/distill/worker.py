"""The distill kind's worker: TRL's DistillationTrainer on a LoRA student, the teacher loaded from the job.

The teacher is an earlier stage's artifact (an adapter chain folded into the base, or a merged model) or a
model the Dagster step resolved (a registered model's directory, a preset, a hub id, a directory). Its tokenizer
must be the student's: the loss compares the two next-token distributions id by id, so a teacher with another
vocabulary is refused before the student loads. The held-out rows are measured before training (the student
with its adapter off: the model it started from), after it, and on the teacher.
"""

from __future__ import annotations

import json
from pathlib import Path

from ...artifacts import progress
from ...config.reporter import Reporter
from ...data.row_parts import reply_text, user_text
from ...evaluate import metrics as task_metrics
from ...evaluate.plots import plot_loss
from ...evaluate.replies import choose_metrics, has_replies, reference_texts
from ...infer.generation import generate
from ...infer.logprobs import completion_loss
from ...models import load_artifact_model, load_model, load_tokenizer, tokenizer_mismatch
from ...train import distributed, held_out
from ...train.trainer import (
    TrainingError,
    TrainingJob,
    apply_speed,
    lora_config,
    prepare,
    progress_callback,
    run_trainer,
)
from ...train.trl_config import TrainerRun
from ...train.variants import as_started
from .divergence import mean_divergence
from .result import DistillResult, ModelFigures
from .settings import TEACHER
from .trl_config import to_trl_config


def load_teacher(job: TrainingJob):
    """(model, tokenizer, name) of the job's teacher: the stage artifact it declares, or the model it references."""
    stages = job.inputs.declared_as(TEACHER)
    referenced = job.inputs.referenced_as(TEACHER)
    if stages:
        ((stage, path),) = stages.items()
        if not path:
            raise TrainingError(f"distill stage {job.settings.name!r}: teacher stage {stage!r} made no artifact")
        model, tokenizer, _ = load_artifact_model(path, hardware=job.hardware)
        return model, tokenizer, f"stage {stage}"
    if referenced:
        (ref,) = referenced
        name = ref.spec + (f" (version {ref.version})" if ref.version else "")
        return load_model(ref.path, job.hardware), load_tokenizer(ref.path), name
    raise TrainingError(f"distill stage {job.settings.name!r}: its job carries no teacher (declared or referenced)")


def reply_rows(rows: list[dict]) -> list[dict]:
    """Rows whose reference reply the NLL is measured on: chat rows as they are, prompt rows with a reference
    answer as a prompt and that answer; rows with neither are left out."""
    if has_replies(rows):
        return [r for r in rows if "completion" in r]
    return [
        {"prompt": r["prompt"], "completion": [{"role": "assistant", "content": str(r["reference"])}]}
        for r in rows
        if r.get("reference") not in (None, "")
    ]


def measure(model, tokenizer, rows: list[dict], settings, max_len: int) -> tuple[ModelFigures, list[str]]:
    """A model's NLL of the reference replies and task metrics of its greedy replies; and those replies."""
    model.eval()
    with_replies = reply_rows(rows)
    nll = completion_loss(model, tokenizer, with_replies, max_len=max_len)["eval_loss"] if with_replies else None
    replies = generate(model, tokenizer, [r["prompt"] for r in rows], max_new_tokens=settings.max_new_tokens)
    references = [reply_text(r) for r in rows] if has_replies(rows) else reference_texts(rows)
    prompts = [user_text(r) for r in rows]
    names = choose_metrics(references, settings.metrics) if references else []
    scored = task_metrics.score(replies, references, prompts, names) if references and replies else {}
    return ModelFigures(nll=nll, metrics=scored), replies


def train_distill(job: TrainingJob, reporter: Reporter) -> DistillResult | None:
    from trl import DistillationTrainer

    settings = job.settings
    teacher, teacher_tokenizer, teacher_name = load_teacher(job)
    p = prepare(job)
    why = tokenizer_mismatch(p.tokenizer, teacher_tokenizer)
    if why:
        raise TrainingError(
            f"distill stage {settings.name!r}: the teacher {teacher_name} does not share the student's tokenizer: "
            f"{why}. Distillation compares next-token distributions id by id; use a teacher of the same family"
        )
    student = "the chain so far" if settings.student == "chain" else "a fresh adapter"
    reporter.log(f"teacher: {teacher_name}; student: {student}")
    out = Path(job.output_dir)
    config = to_trl_config(settings, TrainerRun.of(job, p.speed, workers=p.workers))
    callback = progress_callback(reporter, out)
    trainer = DistillationTrainer(
        model=p.model,
        teacher_model=teacher,
        args=config,
        train_dataset=prompts(p.train_rows),
        # the divergence to the teacher on the prompts measured before and after (the student samples each)
        eval_dataset=held_out.eval_dataset(p.eval_rows[: settings.max_eval_prompts], p.args, prompts),
        processing_class=p.tokenizer,
        peft_config=lora_config(p.lora),
        callbacks=[callback, *held_out.callbacks(p.args)],
    )
    speed = apply_speed(trainer, p.speed, False, reporter)
    held = (p.eval_rows or p.train_rows)[: settings.max_eval_prompts]
    max_len = p.args.max_seq_len
    main = distributed.is_main()
    if main:
        with as_started(trainer.model, p.lora):  # the model the student starts from
            before, replies_before = measure(trainer.model, p.tokenizer, held, settings, max_len)
            divergence_before = divergence(trainer.model, teacher, p.tokenizer, held, replies_before, settings)
        teacher_figures, _ = measure(teacher, p.tokenizer, held, settings, max_len)
        reporter.log(
            f"before training: held-out NLL {before.nll} (teacher {teacher_figures.nll}), divergence from the "
            f"teacher {divergence_before:.4g} on {len(held)} prompts"
        )
    trained = run_trainer(trainer, callback, job, reporter)
    if not main:
        return None
    after, replies_after = measure(trainer.model, p.tokenizer, held, settings, max_len)
    divergence_after = divergence(trainer.model, teacher, p.tokenizer, held, replies_after, settings)
    reporter.log(
        f"after training: held-out NLL {after.nll}, divergence {divergence_before:.4g} -> {divergence_after:.4g}"
    )
    logged = progress.read(out)
    losses = [r["loss"] for r in logged if isinstance(r.get("loss"), (int, float))]
    summary = DistillResult(
        objective=settings.objective(),
        loss_label=f"generalized JSD to the teacher (beta {settings.beta})",
        speed=speed,
        global_step=trainer.state.global_step,
        train_loss=trained.training_loss,
        first_loss=losses[0] if losses else None,
        last_loss=losses[-1] if losses else None,
        held_out=bool(p.eval_rows),
        teacher=teacher_name,
        beta=settings.beta,
        temperature=settings.temperature,
        eval_rows=len(held),
        student_before=before,
        student_after=after,
        teacher_figures=teacher_figures,
        divergence_before=divergence_before,
        divergence_after=divergence_after,
        kept=held_out.kept_adapter(trainer, p.args),
        held_out_rows=held_out.held_out_rows(len(p.eval_rows[: settings.max_eval_prompts]), p.eval_total),
    )
    with (out / "samples.jsonl").open("w") as f:
        for row, old, new in list(zip(held, replies_before, replies_after))[: max(settings.n_samples, 0)]:
            sample = {"prompt": row["prompt"][-1]["content"], "before": old, "after": new}
            f.write(json.dumps(sample, ensure_ascii=False) + "\n")
    (out / "metrics.json").write_text(summary.model_dump_json(indent=2))
    plot_loss(logged, out / "loss.png", title="Distillation loss (divergence to the teacher)")
    reporter.metrics(trainer.state.global_step, eval_figures(summary))
    return summary


def prompts(rows: list[dict]):
    """The rows as DistillationTrainer takes them: the prompts alone (the student samples the replies)."""
    from datasets import Dataset

    return Dataset.from_list([{"prompt": r["prompt"]} for r in rows])


def divergence(student, teacher, tokenizer, rows: list[dict], replies: list[str], settings) -> float:
    return mean_divergence(
        student,
        teacher,
        tokenizer,
        [r["prompt"] for r in rows],
        replies,
        settings.beta,
        settings.temperature,
        settings.args.max_seq_len,
    )


def eval_figures(result: DistillResult) -> dict[str, float]:
    """The held-out figures as MLflow metrics: eval/loss as every stage logs it, the teacher's beside it."""
    values = {
        "eval/loss": result.student_after.nll,
        "eval/loss_before": result.student_before.nll,
        "eval/teacher_loss": result.teacher_figures.nll,
        "eval/divergence": result.divergence_after,
        "eval/divergence_before": result.divergence_before,
        **{f"eval/{k}": v for k, v in result.student_after.metrics.items()},
        **{f"eval/teacher_{k}": v for k, v in result.teacher_figures.metrics.items()},
    }
    return {k: float(v) for k, v in values.items() if isinstance(v, (int, float)) and v == v}
