"""Synthesized training data: preference pairs from a model's own samples (dragon_synthesize_pairs) and
teacher-written SFT rows with a quality pass (dragon_synthesize).

Pairs, two modes:
- judge: the student answers each prompt n_samples_per_prompt times at a temperature, a judge scores every
  sample 1-10, the best and the worst become chosen and rejected; prompts whose samples are identical or
  whose score gap is under min_gap are dropped.
- teacher: the teacher's reply is chosen, the student's rejected. The teacher is a backend, or
  "reference": the dataset's own response, the meaningful offline default.
"""

from __future__ import annotations

import difflib
import json
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ..evaluate.judge import Judge
from ..infer.backends import LocalBackend, as_backend
from ..reporter import Reporter
from ..spec.stages import PreferencePairs, SyntheticDataset
from .tables import reply_text, split_rows, user_text, write_jsonl


@dataclass
class PairsJob:
    settings: PreferencePairs  # the stage's settings; judge: default the student's base model (weak)
    model: str  # the student's base model (resolved)
    adapters: list[str]  # the student's adapter chain
    prompts_file: str  # chat rows whose prompts (and reference replies) are used
    output_dir: str
    hardware: dict = field(default_factory=dict)


def student_backend(job: PairsJob) -> LocalBackend:
    """The student: the latest adapter artifact, its whole chain folded into the base model."""
    if not job.adapters:
        raise ValueError("preference pairs need a student: a training stage before this one")
    return LocalBackend(
        str(Path(job.adapters[-1]).parent),
        device=job.hardware.get("device", "auto"),
        dtype=job.hardware.get("dtype", "auto"),
    )


def synthesize_pairs(job: PairsJob, reporter: Reporter) -> dict:
    from .tables import read_jsonl

    source = read_jsonl(job.prompts_file)
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
    return LocalBackend(job.model, device=job.hardware.get("device", "auto"), dtype=job.hardware.get("dtype", "auto"))


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


def write_pairs(job: PairsJob, kept: list[dict], dropped: dict, reporter: Reporter) -> dict:
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
    return {"kept": len(kept), "dropped": dropped, "train_rows": len(train), "eval_rows": len(held), "preview": preview}


# --- teacher-written SFT data -------------------------------------------------------------------------------


@dataclass
class SyntheticJob:
    settings: SyntheticDataset
    prompts_file: str
    output_dir: str
    hardware: dict = field(default_factory=dict)


def alpha_ratio(text: str) -> float:
    visible = [c for c in text if not c.isspace()]
    return sum(c.isalpha() for c in visible) / len(visible) if visible else 0.0


def quality_pass(rows: list[dict], job: SyntheticJob) -> tuple[list[dict], Counter]:
    """Drop too short or long, garbled, repeated prompts and (near-)repeated responses, counted by reason."""
    kept, dropped, seen_prompts, seen_replies = [], Counter(), set(), []
    for row in rows:
        prompt, reply = user_text(row).strip(), reply_text(row).strip()
        if len(reply) < job.settings.min_chars:
            dropped["too_short"] += 1
        elif job.settings.max_chars is not None and len(reply) > job.settings.max_chars:
            dropped["too_long"] += 1
        elif alpha_ratio(reply) < job.settings.min_alpha_ratio:
            dropped["garbled"] += 1
        elif job.settings.dedupe and prompt in seen_prompts:
            dropped["repeated_prompt"] += 1
        elif job.settings.dedupe and any(reply == r for r in seen_replies):
            dropped["repeated_response"] += 1
        elif job.settings.dedupe and any(
            difflib.SequenceMatcher(None, reply, r).ratio() >= job.settings.near_dup_threshold for r in seen_replies
        ):
            dropped["near_repeated_response"] += 1
        else:
            kept.append(row)
            seen_prompts.add(prompt)
            seen_replies.append(reply)
    return kept, dropped


def synthesize_sft(job: SyntheticJob, reporter: Reporter) -> dict:
    from .tables import read_jsonl

    source = read_jsonl(job.prompts_file)
    prompts = [r["prompt"] for r in source]
    reporter.log(f"teacher answers {len(prompts)} prompts")
    replies = as_backend(job.settings.teacher).chat(
        prompts,
        max_new_tokens=job.settings.max_new_tokens,
        temperature=job.settings.temperature,
        system=job.settings.system,
    )
    rows = [
        {
            "prompt": ([{"role": "system", "content": job.settings.system}] if job.settings.system else [])
            + [m for m in p if m["role"] != "system"],
            "completion": [{"role": "assistant", "content": reply}],
        }
        for p, reply in zip(prompts, replies)
    ]
    kept, dropped = quality_pass(rows, job)
    if job.settings.judge is not None and kept:
        scores = Judge(
            as_backend(job.settings.judge),
            rubric=job.settings.rubric,
            cache_path=Path(job.output_dir) / "judge_cache.sqlite",
        ).score([r["prompt"] for r in kept], [reply_text(r) for r in kept])
        gated = [r for r, s in zip(kept, scores) if s.score is not None and s.score >= job.settings.min_score]
        dropped["judge_below_min_score"] += sum(
            1 for s in scores if s.score is not None and s.score < job.settings.min_score
        )
        dropped["judge_unparsed"] += sum(1 for s in scores if s.score is None)
        kept = gated
    if not kept:
        raise ValueError(f"the quality pass kept no rows: dropped {dict(dropped)}")
    train, held = split_rows(kept, job.settings.eval_frac, job.settings.seed)
    out = Path(job.output_dir)
    write_jsonl(out / "train.jsonl", train)
    write_jsonl(out / "eval.jsonl", held)
    (out / "dropped.json").write_text(json.dumps(dict(dropped), indent=2))
    return {
        "kept": len(kept),
        "dropped": dict(dropped),
        "train_rows": len(train),
        "eval_rows": len(held),
        "preview": [{"prompt": user_text(r), "response": reply_text(r)} for r in kept[:5]],
    }
