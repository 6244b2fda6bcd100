"""The preference_pairs kind's worker: pairs made from a model's own samples (dragon_synthesize_pairs), two modes:

- judge: the student answers each prompt n_samples_per_prompt times at a temperature, a judge scores every
  sample 1-10, the best and the worst become chosen and rejected; prompts whose samples are identical or
  whose score gap is under min_gap are dropped.
- teacher: the teacher's reply is chosen, the student's rejected. The teacher is a backend, or
  "reference": the dataset's own response, the meaningful offline default.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

from ...artifacts.manifest import DataResult
from ...config.job import Job, SynthesisInputs
from ...config.reporter import Reporter
from ...data.holdout import split_rows
from ...data.row_parts import reply_text, user_text
from ...data.tables import read_jsonl, write_jsonl
from ...evaluate.judge import Judge
from ...infer.backend_registry import as_backend
from ...infer.local_backend import LocalBackend
from .settings import PreferencePairs

PairsJob = Job[PreferencePairs, SynthesisInputs]


def student_backend(job: PairsJob) -> LocalBackend:
    """The student: the latest adapter artifact, its whole chain folded into the base model."""
    if not job.inputs.adapters:
        raise ValueError("preference pairs need a student: a training stage before this one")
    return LocalBackend(str(Path(job.inputs.adapters[-1]).parent), device=job.hardware.device, dtype=job.hardware.dtype)


def synthesize_pairs(job: PairsJob, reporter: Reporter) -> DataResult:
    source = read_jsonl(job.inputs.prompts_file)
    random.Random(job.settings.seed).shuffle(source)
    rows = source[: job.settings.n]
    student = student_backend(job)
    prompts = [r["prompt"] for r in rows]
    kept, dropped = [], Counter()
    if job.settings.mode == "teacher":
        reporter.log(f"teacher mode: {len(rows)} prompts, student samples at temperature {job.settings.temperature}")
        students = student.chat(
            prompts, max_new_tokens=job.settings.max_new_tokens, temperature=job.settings.temperature
        )
        teachers = (
            [reply_text(r) for r in rows]
            if job.settings.teacher == "reference"
            else as_backend(job.settings.teacher).chat(prompts, max_new_tokens=job.settings.max_new_tokens)
        )
        for row, chosen, rejected in zip(rows, teachers, students):
            reason = _drop_reason(chosen, rejected)
            if reason:
                dropped[reason] += 1
                continue
            kept.append(_pair(row, chosen, rejected))
    else:
        judge = Judge(
            as_backend(job.settings.judge) if job.settings.judge else student_base(job),
            rubric=job.settings.rubric,
            cache_path=Path(job.output_dir) / "judge_cache.sqlite",
        )
        reporter.log(
            f"judge mode: {len(rows)} prompts x {job.settings.n_samples_per_prompt} samples, "
            f"judged by {judge.backend!r}"
        )
        for row in rows:
            samples = student.chat(
                [row["prompt"]] * job.settings.n_samples_per_prompt,
                max_new_tokens=job.settings.max_new_tokens,
                temperature=job.settings.temperature,
            )
            scores = judge.score([row["prompt"]] * len(samples), samples, [reply_text(row)] * len(samples))
            scored = [(s.score, text) for s, text in zip(scores, samples) if s.score is not None]
            if len(scored) < 2:
                dropped["judge_unparsed"] += 1
                continue
            best, worst = max(scored), min(scored)
            if best[1].strip() == worst[1].strip():
                dropped["identical_samples"] += 1
            elif best[0] - worst[0] < job.settings.min_gap:
                dropped["gap_under_min_gap"] += 1
            else:
                kept.append({**_pair(row, best[1], worst[1]), "chosen_score": best[0], "rejected_score": worst[0]})
    return write_pairs(job, kept, dict(dropped), reporter)


def student_base(job: PairsJob) -> LocalBackend:
    return LocalBackend(job.inputs.model, device=job.hardware.device, dtype=job.hardware.dtype)


def _drop_reason(chosen: str, rejected: str) -> str | None:
    if not chosen.strip() or not rejected.strip():
        return "empty_reply"
    if chosen.strip() == rejected.strip():
        return "chosen_equals_rejected"
    return None


def _pair(row: dict, chosen: str, rejected: str) -> dict:
    return {
        "prompt": row["prompt"],
        "chosen": [{"role": "assistant", "content": chosen}],
        "rejected": [{"role": "assistant", "content": rejected}],
    }


def write_pairs(job: PairsJob, kept: list[dict], dropped: dict, reporter: Reporter) -> DataResult:
    out = Path(job.output_dir)
    write_jsonl(out / "pairs.jsonl", kept)
    if not kept:
        raise ValueError(f"no preference pairs were kept: dropped {dropped}")
    train, held = split_rows(kept, job.settings.eval_frac, job.settings.seed)
    write_jsonl(out / "train.jsonl", train)
    write_jsonl(out / "eval.jsonl", held)
    reporter.log(f"kept {len(kept)} pairs, dropped {sum(dropped.values())} ({dropped})")
    preview = [
        {"prompt": user_text(p), "chosen": p["chosen"][0]["content"], "rejected": p["rejected"][0]["content"]}
        for p in kept[:5]
    ]
    return DataResult(kept=len(kept), dropped=dropped, train_rows=len(train), eval_rows=len(held), preview=preview)
