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
HELD_OUT = "_held_out"  # a pair made from the source's held-out rows (dropped before the pairs are written)


def student_backend(job: PairsJob) -> LocalBackend:
    """The student: the latest adapter artifact, its whole chain folded into the base model."""
    if not job.inputs.adapters:
        raise ValueError("preference pairs need a student: a training stage before this one")
    return LocalBackend(str(Path(job.inputs.adapters[-1]).parent), device=job.hardware.device, dtype=job.hardware.dtype)


def held_out_count(n: int, eval_frac: float) -> int:
    """How many of n pairs are held out: split_rows' rule (none under 20, at least one otherwise)."""
    return 0 if n < 20 or eval_frac == 0 else max(1, round(n * eval_frac))


def pick_prompts(job: PairsJob) -> tuple[list[dict], list[dict]]:
    """The rows pairs are made from: (to train on, to hold out). The held-out pairs come from the source's held-out
    rows where it has them: its training rows were trained on by the stages before this one (the chosen reply of a
    reference pair is the SFT target), so pairs held out from them would score recall (the report's contamination
    check flags them). Without held-out rows in the source, the pairs are split as any dataset is."""
    rng = random.Random(job.settings.seed)
    source = read_jsonl(job.inputs.prompts_file)
    rng.shuffle(source)
    held_file = job.inputs.held_out_file
    held_source = read_jsonl(held_file) if held_file and Path(held_file).exists() else []
    if not held_source:
        return source[: job.settings.n], []
    rng.shuffle(held_source)
    held = held_source[: held_out_count(job.settings.n, job.settings.eval_frac)]
    return source[: job.settings.n - len(held)], held


def synthesize_pairs(job: PairsJob, reporter: Reporter) -> DataResult:
    train_rows, held_rows = pick_prompts(job)
    rows = train_rows + held_rows
    held_out = {id(r) for r in held_rows}
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
            kept.append(_pair(row, chosen, rejected, id(row) in held_out))
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
                pair = _pair(row, best[1], worst[1], id(row) in held_out)
                kept.append({**pair, "chosen_score": best[0], "rejected_score": worst[0]})
    return write_pairs(job, kept, dict(dropped), reporter)


def student_base(job: PairsJob) -> LocalBackend:
    return LocalBackend(job.inputs.model, device=job.hardware.device, dtype=job.hardware.dtype)


def _drop_reason(chosen: str, rejected: str) -> str | None:
    if not chosen.strip() or not rejected.strip():
        return "empty_reply"
    if chosen.strip() == rejected.strip():
        return "chosen_equals_rejected"
    return None


def _pair(row: dict, chosen: str, rejected: str, held_out: bool = False) -> dict:
    return {
        "prompt": row["prompt"],
        "chosen": [{"role": "assistant", "content": chosen}],
        "rejected": [{"role": "assistant", "content": rejected}],
        **({HELD_OUT: True} if held_out else {}),
    }


def write_pairs(job: PairsJob, kept: list[dict], dropped: dict, reporter: Reporter) -> DataResult:
    out = Path(job.output_dir)
    if not kept:
        write_jsonl(out / "pairs.jsonl", kept)
        raise ValueError(f"no preference pairs were kept: dropped {dropped}")
    if any(HELD_OUT in p for p in kept):
        # held out by where the prompt came from (the source's held-out rows), not by a split of the pairs
        train = [p for p in kept if HELD_OUT not in p]
        held = [{k: v for k, v in p.items() if k != HELD_OUT} for p in kept if HELD_OUT in p]
        kept = train + held
    else:
        train, held = split_rows(kept, job.settings.eval_frac, job.settings.seed)
    write_jsonl(out / "pairs.jsonl", kept)
    write_jsonl(out / "train.jsonl", train)
    write_jsonl(out / "eval.jsonl", held)
    reporter.log(f"kept {len(kept)} pairs, dropped {sum(dropped.values())} ({dropped})")
    preview = [
        {"prompt": user_text(p), "chosen": p["chosen"][0]["content"], "rejected": p["rejected"][0]["content"]}
        for p in kept[:5]
    ]
    return DataResult(kept=len(kept), dropped=dropped, train_rows=len(train), eval_rows=len(held), preview=preview)
