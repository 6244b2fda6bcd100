"""Distillation against SFT on the same prompts: a fresh LoRA adapter on SmolLM2-135M-Instruct taught the support
tickets either by on-policy distillation from a teacher (the distill kind, TRL's DistillationTrainer) or by SFT on
the dataset's own replies (the sft kind), the same steps, batch, learning rate and rows, over training seeds.

The teacher is the support pipeline's merged model (SFT, DPO and GRPO on the tickets: `make demo` makes one) and
the rows are that run's sft_dataset artifact, so the held-out tickets are the ones the teacher never saw. Each
run reports, on the held-out tickets: the mean NLL of the reference replies (token-weighted) and each row's own,
token_f1 of the greedy replies, and the student's divergence from the teacher over its own greedy replies (the
distillation objective). Between the methods: per seed, and a sign test over the held-out rows of each row's NLL
(mean over seeds).

    .venv/bin/python benchmarks/distill_learning.py --runs runs    # the latest support artifacts under runs/
    .venv/bin/python benchmarks/distill_learning.py --teacher DIR --data DIR --steps 16 --seeds 1,2,3

Log lines go to stderr; stdout carries one JSON line. Each run's record is kept in <out>/runs.jsonl.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from statistics import mean, median

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from grpo_learning import sign_test  # noqa: E402 - the same exact test as the GRPO benchmark


def latest(runs: Path, stage: str) -> Path:
    found = sorted((runs / "artifacts" / "support" / stage).glob("*/manifest.json"))
    if not found:
        raise SystemExit(f"no support/{stage} artifact under {runs}: run `make demo` first, or pass --teacher/--data")
    return found[-1].parent


class StderrReporter:
    stop_requested = False

    def log(self, message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    def metrics(self, step: int, values: dict) -> None:
        pass

    def should_stop(self) -> bool:
        return False


def train(method: str, seed: int, a, out: Path) -> dict:
    """One run: the method's stage on a fresh adapter, then the held-out figures of the trained student."""
    import torch

    torch.set_num_threads(a.threads)
    from peft import PeftModel

    from dragon_dagster.engine import catalog, models
    from dragon_dagster.engine.config.hardware import Hardware
    from dragon_dagster.engine.config.job import ReferencedModel, TrainingInputs
    from dragon_dagster.engine.data.tables import read_jsonl
    from dragon_dagster.engine.infer.logprobs import completion_loss
    from dragon_dagster.engine.stages.distill.worker import divergence, measure

    run_dir = out / f"{method}-seed{seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    base = str(models.embedded_model_dir())
    args = {
        "epochs": 1,
        "learning_rate": a.lr,
        "batch_size": a.batch_size,
        "grad_accum": 1,
        "max_seq_len": 384,
        "max_steps": a.steps,
        "warmup_ratio": 0.0,
        "logging_steps": 1,
        "save_steps": 10_000,
        "seed": seed,
    }
    common = dict(name=f"{method}_adapter", dataset="sft_dataset", args=args, n_samples=0, max_new_tokens=a.tokens)
    distill = catalog.parse_stage(
        {
            **common,
            "kind": "distill",
            "teacher": {"model": str(a.teacher)},
            "student": "base",
            "beta": a.beta,
            "max_eval_prompts": 0,
        }
    )
    settings = distill if method == "distill" else catalog.parse_stage({**common, "kind": "sft"})
    inputs = TrainingInputs(
        model=base,
        train_file=str(a.data / "train.jsonl"),
        eval_file=str(a.data / "eval.jsonl"),
        checkpoint_dir=str(run_dir / "checkpoints"),
        referenced=[ReferencedModel(role="teacher", spec=str(a.teacher), path=str(a.teacher))]
        if method == "distill"
        else [],
    )
    kind = catalog.get(settings.kind)
    job = kind.job_model()(settings=settings, inputs=inputs, output_dir=str(run_dir), hardware=Hardware(device="cpu"))
    started = time.time()
    kind.load_worker()(job, StderrReporter())
    wall = time.time() - started

    hardware = Hardware(device="cpu")
    tokenizer = models.load_tokenizer(base)
    student = PeftModel.from_pretrained(models.load_model(base, hardware), str(run_dir / "adapter")).eval()
    teacher = models.load_model(str(a.teacher), hardware)
    held = read_jsonl(a.data / "eval.jsonl")
    figures, replies = measure(student, tokenizer, held, distill, 384)
    rows_nll = completion_loss(student, tokenizer, held, max_len=384)["row_nll"]
    record = {
        "method": method,
        "seed": seed,
        "steps": a.steps,
        "nll": figures.nll,
        "token_f1": figures.metrics.get("token_f1"),
        "divergence": divergence(student, teacher, tokenizer, held, replies, distill),
        "row_nll": rows_nll,
        "train_wall_s": round(wall, 1),
    }
    with (out / "runs.jsonl").open("a") as f:
        f.write(json.dumps(record) + "\n")
    print(
        f"[distill_learning] {method} seed {seed}: NLL {record['nll']:.4f}, f1 {record['token_f1']:.4f}, "
        f"divergence {record['divergence']:.4f}, {wall:.0f}s",
        file=sys.stderr,
        flush=True,
    )
    return record


def start_figures(a) -> dict:
    """The base (the students' start) and the teacher on the held-out rows, once."""
    import torch

    torch.set_num_threads(a.threads)
    from dragon_dagster.engine import catalog, models
    from dragon_dagster.engine.config.hardware import Hardware
    from dragon_dagster.engine.data.tables import read_jsonl
    from dragon_dagster.engine.stages.distill.worker import divergence, measure

    hardware = Hardware(device="cpu")
    base = str(models.embedded_model_dir())
    tokenizer = models.load_tokenizer(base)
    held = read_jsonl(a.data / "eval.jsonl")
    stage = catalog.parse_stage(
        {
            "name": "d",
            "kind": "distill",
            "dataset": "x",
            "teacher": {"model": str(a.teacher)},
            "beta": a.beta,
            "max_new_tokens": a.tokens,
        }
    )
    student, teacher = models.load_model(base, hardware), models.load_model(str(a.teacher), hardware)
    base_figures, replies = measure(student, tokenizer, held, stage, 384)
    teacher_figures, _ = measure(teacher, tokenizer, held, stage, 384)
    return {
        "base_nll": base_figures.nll,
        "base_token_f1": base_figures.metrics.get("token_f1"),
        "base_divergence": divergence(student, teacher, tokenizer, held, replies, stage),
        "teacher_nll": teacher_figures.nll,
        "teacher_token_f1": teacher_figures.metrics.get("token_f1"),
        "held_out_rows": len(held),
    }


def summarize(runs: list[dict]) -> dict:
    per_method = {}
    for method in ("distill", "sft"):
        mine = [r for r in runs if r["method"] == method]
        per_method[method] = {
            key: {
                "median": median(r[key] for r in mine),
                "range": [min(r[key] for r in mine), max(r[key] for r in mine)],
            }
            for key in ("nll", "token_f1", "divergence", "train_wall_s")
        }
    by_row = {
        m: [mean(col) for col in zip(*(r["row_nll"] for r in runs if r["method"] == m))] for m in ("distill", "sft")
    }
    wins = sum(d < s for d, s in zip(by_row["distill"], by_row["sft"]))
    losses = sum(d > s for d, s in zip(by_row["distill"], by_row["sft"]))
    return {
        "per_method": per_method,
        "rows_distill_lower_nll": wins,
        "rows_sft_lower_nll": losses,
        "sign_test_p": round(sign_test(wins, losses), 4),
    }


def main() -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=Path, default=ROOT / "runs", help="where `make demo` left the support artifacts")
    p.add_argument("--teacher", type=Path, help="a model directory (default: the latest support merged model)")
    p.add_argument("--data", type=Path, help="a dataset artifact (default: the latest support sft_dataset)")
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--tokens", type=int, default=64, help="max_new_tokens: rollouts and held-out replies")
    p.add_argument("--beta", type=float, default=1.0, help="the distill stage's divergence (TRL's default 1)")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--parallel", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", help="output directory (default: a temporary one)")
    a = p.parse_args()
    a.teacher = (a.teacher or latest(a.runs, "merged_model") / "model").resolve()
    a.data = (a.data or latest(a.runs, "sft_dataset")).resolve()
    out = Path(a.out or tempfile.mkdtemp(prefix="distill_learning_"))
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    seeds = [int(s) for s in a.seeds.split(",")]
    order = [(m, s) for s in seeds for m in ("distill", "sft")]  # interleaved: each seed's methods side by side
    with ThreadPoolExecutor(a.parallel) as pool:
        start = pool.submit(start_figures, a)
        runs = list(pool.map(lambda ms: run_isolated(ms[0], ms[1], a, out), order))
    result = {
        "teacher": str(a.teacher),
        "data": str(a.data),
        "settings": {k: getattr(a, k) for k in ("steps", "lr", "batch_size", "tokens", "beta", "threads")},
        "seeds": seeds,
        **start.result(),
        **summarize(runs),
        "wall_s": round(time.time() - started, 1),
        "out": str(out),
    }
    print(json.dumps(result), flush=True)
    return result


def run_isolated(method: str, seed: int, a, out: Path) -> dict:
    """Each run in its own interpreter (torch's thread settings and TRL's seeding are process-wide)."""
    import subprocess

    settings = out / f"{method}-seed{seed}.args.json"
    settings.write_text(json.dumps({k: str(v) if isinstance(v, Path) else v for k, v in vars(a).items()}))
    done = subprocess.run(
        [sys.executable, __file__, "--one", method, str(seed), str(settings), str(out)], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"{method} seed {seed} failed: {done.stderr[-3000:]}")
    lines = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    return next(r for r in reversed(lines) if r["method"] == method and r["seed"] == seed)


def one(method: str, seed: str, settings: str, out: str) -> None:
    a = argparse.Namespace(**json.loads(Path(settings).read_text()))
    a.teacher, a.data = Path(a.teacher), Path(a.data)
    train(method, int(seed), a, Path(out))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        one(*sys.argv[2:6])
    else:
        main()
