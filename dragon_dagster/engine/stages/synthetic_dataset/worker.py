"""The synthetic_dataset kind's worker: a teacher writes SFT rows for a dataset's prompts (dragon_synthesize),
then a quality pass drops too short or long, garbled and (near-)repeated rows, and an optional judge gate."""

from __future__ import annotations

import difflib
import json
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
from .settings import SyntheticDataset

SyntheticJob = Job[SyntheticDataset, SynthesisInputs]


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


def synthesize_sft(job: SyntheticJob, reporter: Reporter) -> DataResult:
    source = read_jsonl(job.inputs.prompts_file)
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
    return DataResult(
        kept=len(kept),
        dropped=dict(dropped),
        train_rows=len(train),
        eval_rows=len(held),
        preview=[{"prompt": user_text(r), "response": reply_text(r)} for r in kept[:5]],
    )
