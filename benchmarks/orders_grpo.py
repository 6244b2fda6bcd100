"""Does GRPO with the tool in the loop close part of the gap SFT leaves when it sees few tool-use traces?

The bundled orders pipeline (dragon_dagster/defs/orders) run through Dagster, as `dragon demo --pipeline orders`
runs it, but with its SFT stage cut to --sft-steps steps of 4 conversations (the quick profile trains 40, after
which the model calls the tool right on every held-out conversation) and its GRPO stage, with the tool in the loop,
given --grpo-steps steps. Per training seed, both models answer the same held-out conversations that call a tool
(the pipeline's 10% split, whole conversations never trained on; engine/evaluate/tool_use.py, greedy): the model
after SFT (SFT alone) and after SFT then GRPO. Each case's call_correct and answer_exact are paired, and McNemar's
exact test says whether GRPO changed more than chance, per seed and pooled over the seeds.

    .venv/bin/python benchmarks/orders_grpo.py --seeds 1 2 3 --out runs-orders       # ~10 min a seed on 2 cores

Log lines go to stderr; stdout carries only the summary JSON line; each seed's line is appended to
<out>/runs.jsonl as it ends.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PIPELINE = ROOT / "dragon_dagster" / "defs" / "orders" / "defs.yaml"
STAGES = ["traces", "questions", "trace_dataset", "sft_adapter", "order_questions", "grpo_adapter"]


def log(message: str) -> None:
    print(f"[orders_grpo {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="training seeds (SFT's and GRPO's)")
    p.add_argument("--sft-steps", type=int, default=8, help="SFT steps of 4 conversations (the quick profile: 40)")
    p.add_argument("--grpo-steps", type=int, default=16, help="GRPO steps of 2 questions x 4 completions")
    p.add_argument("--grpo-lr", type=float, default=1e-4, help="GRPO's learning rate (the pipeline's)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="reply budget in the measurement")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--out", required=True, help="output directory (each seed's runs and runs.jsonl)")
    return p.parse_args(argv)


def train(seed: int, a, out: Path) -> dict:
    """The orders pipeline's stages up to GRPO, through Dagster, in this seed's own runs folder and instance."""
    from dagster import DagsterInstance

    from dragon_dagster.assets.launch import materialize_pipeline
    from dragon_dagster.engine.pipeline import load
    from dragon_dagster.resources import ArtifactStore, MLflowTracking, TrainingResource

    runs = out / f"seed{seed}"
    resources = {
        "store": ArtifactStore(runs_dir=str(runs)),
        "tracking": MLflowTracking(runs_dir=str(runs)),
        "training": TrainingResource(device="cpu"),
    }
    sft_args = {"max_steps": a.sft_steps, "batch_size": 4, "grad_accum": 1, "learning_rate": 5.0e-4}
    extra = {
        "orders__sft_adapter": {"args": {**sft_args, "logging_steps": 2, "save_steps": 1000, "seed": seed}},
        "orders__grpo_adapter": {
            "args": {"max_steps": a.grpo_steps, "logging_steps": 1, "learning_rate": a.grpo_lr, "seed": seed},
            "max_eval_prompts": 8,
        },
    }
    started = time.time()
    outcome = materialize_pipeline(
        load(PIPELINE), "quick", resources, DagsterInstance.ephemeral(), extra_config=extra, only=STAGES
    )
    if not outcome["success"]:
        raise SystemExit(f"seed {seed}: the pipeline failed; its log is above")
    seconds = {row["asset"].split("/")[-1]: round(row["seconds"], 1) for row in outcome["stages"]}
    log(f"seed {seed}: trained in {time.time() - started:.0f} s ({seconds})")
    return {"artifacts": outcome["artifacts"], "seconds": seconds}


def measure(artifacts: dict, a) -> dict:
    """Tool figures of the model after SFT and after SFT then GRPO on the held-out conversations, per case."""
    from dragon_dagster.engine import models
    from dragon_dagster.engine.config.hardware import Hardware
    from dragon_dagster.engine.data.tables import read_jsonl
    from dragon_dagster.engine.evaluate import tool_use
    from dragon_dagster.engine.pipeline import load
    from dragon_dagster.engine.text.matchers import exact
    from dragon_dagster.engine.tools import template
    from dragon_dagster.engine.tools.declare import Toolset, with_tools

    pipeline = load(PIPELINE)
    toolset = Toolset.from_settings(pipeline.tools)
    rows = read_jsonl(Path(artifacts["trace_dataset"]) / "eval.jsonl")
    with_tools(rows, toolset.schemas)
    cases = tool_use.tool_cases(rows)
    base = str(models.embedded_model_dir())
    sft = str(Path(artifacts["sft_adapter"]) / "adapter")
    grpo = str(Path(artifacts["grpo_adapter"]) / "adapter")
    out = {}
    for name, adapters in (("sft", [sft]), ("sft_grpo", [sft, grpo])):
        tokenizer = models.load_tokenizer(base)
        template.prepare(tokenizer, needed=True)
        model = models.load_model(base, Hardware(device="cpu"), adapters=adapters)
        measured = tool_use.measure(model, tokenizer, cases, toolset, a.max_new_tokens)
        answers = [exact(s["answer"], c["answer"]) for s, c in zip(measured["samples"], cases)]
        out[name] = {"figures": measured["figures"], "call_correct": measured["call_correct"], "answer_exact": answers}
        log(f"{name}: {measured['figures']}")
        del model
    return out


def one_seed(seed: int, a, out: Path) -> dict:
    trained = train(seed, a, out)
    measured = measure(trained["artifacts"], a)
    sft, both = measured["sft"], measured["sft_grpo"]
    record = {
        "seed": seed,
        "sft_steps": a.sft_steps,
        "grpo_steps": a.grpo_steps,
        "cases": len(sft["call_correct"]),
        "sft": sft["figures"],
        "sft_grpo": both["figures"],
        "call_correct_paired": tool_use_test(sft["call_correct"], both["call_correct"]),
        "answer_exact_paired": tool_use_test(sft["answer_exact"], both["answer_exact"]),
        "per_case": {k: {"sft": sft[k], "sft_grpo": both[k]} for k in ("call_correct", "answer_exact")},
        "seconds": trained["seconds"],
        "grpo_result": grpo_figures(trained["artifacts"]["grpo_adapter"]),
    }
    with (out / "runs.jsonl").open("a") as f:
        f.write(json.dumps(record) + "\n")
    return record


def tool_use_test(before: list[float], after: list[float]) -> dict:
    from dragon_dagster.engine.evaluate.tool_use import mcnemar

    paired = mcnemar(before, after)
    return {"only_sft": paired["only_base"], "only_sft_grpo": paired["only_merged"], "p_value": paired["p_value"]}


def grpo_figures(artifact: str) -> dict:
    """What the GRPO stage itself saw: its rewards before and after on its held-out questions, KL, flat groups."""
    result = json.loads((Path(artifact) / "metrics.json").read_text())
    keep = ("reward_before", "reward_after", "per_reward_before", "per_reward_after", "kl", "clipped_ratio", "tools")
    return {k: result.get(k) for k in keep}


def summarize(records: list[dict]) -> dict:
    pooled = {}
    for figure in ("call_correct", "answer_exact"):
        before = [v for r in records for v in r["per_case"][figure]["sft"]]
        after = [v for r in records for v in r["per_case"][figure]["sft_grpo"]]
        pooled[figure] = {
            "sft_median": median(r["sft"][figure] for r in records),
            "sft_grpo_median": median(r["sft_grpo"][figure] for r in records),
            "sft_range": [min(r["sft"][figure] for r in records), max(r["sft"][figure] for r in records)],
            "sft_grpo_range": [
                min(r["sft_grpo"][figure] for r in records),
                max(r["sft_grpo"][figure] for r in records),
            ],
            "pooled": tool_use_test(before, after),
        }
    return {"seeds": [r["seed"] for r in records], "cases_per_seed": records[0]["cases"], "figures": pooled}


def main(argv=None) -> dict:
    a = parse_args(argv)
    import torch

    torch.set_num_threads(a.threads)
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    records = []
    for seed in a.seeds:
        records.append(one_seed(seed, a, out))
        log(
            f"seed {seed}: call_correct {records[-1]['sft']['call_correct']} -> "
            f"{records[-1]['sft_grpo']['call_correct']}, answer_exact {records[-1]['sft']['answer_exact']} -> "
            f"{records[-1]['sft_grpo']['answer_exact']}"
        )
    summary = {"settings": vars(a), **summarize(records)}
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
