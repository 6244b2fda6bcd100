"""This project's training paths against plain TRL (../shared/bench/anchor_trl.py), in one run, on one machine.

    python benchmarks/compare_trl.py                       # CPU: tiny model shape, a few minutes
    python benchmarks/compare_trl.py --arch smol --steps 20 --bs 16 --gen-bs 64 --comp 128   # GPU

Both sides get the same random-weight model shape (the anchor's configs), the same synthetic rows (the
anchor's generator and seed), the same LoRA (r 16, alpha 32, all linear layers) and learning rates. Each
measurement runs in its own process, so its peak memory is its own. Printed: one JSON line per
measurement, then a table of ratios (this project / plain TRL):

- SFT trained tokens/s (non-padding tokens through the model per second, TRL's num_tokens), unpacked
  and packed, against the anchor's matching row;
- GRPO completions/s and completion tokens/s;
- DPO and ORPO pairs/s and KTO rows/s (rows per second, from the median step after the first 3), plus trained tokens/s
  (TRL's num_tokens, which DPO and KTO log; ORPO does not); the peer here is PEER_PREFERENCE below, plain TRL
  as its docs show DPOTrainer, ORPOTrainer and KTOTrainer (no reference model with a LoRA), run on the same
  saved model and the same rows
  (conversational pairs from the anchor's sentence generator; KTO: the same prompts, liked/disliked alternating);
- peak memory (CUDA max allocated on a GPU, else the process's peak RSS);
- Dagster overhead: a materialization of the SFT asset (run, Pipes child, MLflow, artifact store) minus
  the same job run straight through the engine's worker, best of --repeats.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ANCHOR = ROOT.parent / "shared" / "bench" / "anchor_trl.py"

# Runs a script or `-m module` and prints its peak memory at exit: the same yardstick for both sides.
PEAK = textwrap.dedent("""\
    import atexit, json, resource, runpy, sys
    def report():
        out = {"rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            out["cuda_gib"] = torch.cuda.max_memory_allocated() / 2**30
        print("PEAK " + json.dumps(out), flush=True)
    atexit.register(report)
    target = sys.argv.pop(1)
    if target == "-m":
        module = sys.argv.pop(1); sys.argv[0] = module
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        sys.argv[0] = target
        runpy.run_path(target, run_name="__main__")
    """)


def arch_config(arch: str, vocab: int):
    """The anchor's model shapes."""
    from transformers import LlamaConfig, Qwen2Config

    if arch == "tiny":
        return LlamaConfig(
            vocab_size=vocab,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=2048,
        )
    if arch == "smol":
        return LlamaConfig(
            vocab_size=49152,
            hidden_size=576,
            intermediate_size=1536,
            num_hidden_layers=30,
            num_attention_heads=9,
            num_key_value_heads=3,
            max_position_embeddings=8192,
            rope_theta=100000.0,
            rms_norm_eps=1e-5,
            tie_word_embeddings=True,
        )
    return Qwen2Config(
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
    )


def random_model(arch: str, tokenizer_dir: Path, out: Path) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(arch_config(arch, len(tokenizer)))
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


# The anchor's data generator, so both sides train on rows of the same shape.
WORDS = (
    "router thermostat firmware reset invoice refund shipping battery wifi update password account "
    "screen warranty replacement camera doorbell app login error charge order delayed"
).split()


def sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."


def sft_rows(n: int, rng: random.Random) -> list[dict]:
    def text(low, high):
        return " ".join(sentence(rng, rng.randint(8, 20)) for _ in range(rng.randint(low, high)))

    return [
        {
            "prompt": [{"role": "user", "content": text(2, 6)}],
            "completion": [{"role": "assistant", "content": text(2, 8)}],
        }
        for _ in range(n)
    ]


def grpo_rows(n: int, rng: random.Random) -> list[dict]:
    pairs = ((rng.randint(10, 999), rng.randint(10, 999)) for _ in range(n))
    return [
        {
            "prompt": [{"role": "user", "content": f"What is {x} + {y}? Reply with just the number."}],
            "reference": str(x + y),
        }
        for x, y in pairs
    ]


def dpo_rows(n: int, rng: random.Random) -> list[dict]:
    """Conversational preference pairs, as the project's pairs_dataset writes them."""

    def text(low, high):
        return " ".join(sentence(rng, rng.randint(8, 20)) for _ in range(rng.randint(low, high)))

    return [
        {
            "prompt": [{"role": "user", "content": text(2, 6)}],
            "chosen": [{"role": "assistant", "content": text(2, 8)}],
            "rejected": [{"role": "assistant", "content": text(2, 8)}],
        }
        for _ in range(n)
    ]


def kto_rows(n: int, rng: random.Random) -> list[dict]:
    """Rated replies, as the project's rated_dataset writes them: liked and disliked alternating."""

    def text(low, high):
        return " ".join(sentence(rng, rng.randint(8, 20)) for _ in range(rng.randint(low, high)))

    return [
        {
            "prompt": [{"role": "user", "content": text(2, 6)}],
            "completion": [{"role": "assistant", "content": text(2, 8)}],
            "label": i % 2 == 0,
        }
        for i in range(n)
    ]


PREFERENCE_ROWS = {"dpo": dpo_rows, "orpo": dpo_rows, "kto": kto_rows}
PAIRED = ("dpo", "orpo")  # rows are pairs: pairs/s; KTO's are single rated replies: rows/s

# The peer for DPO and KTO, written as the anchor is: plain TRL as its docs show it, timed by the anchor's
# Timer and steady. It loads the saved random model (the anchor's shape) and trains on the rows file both sides
# get. One JSON line: pairs_per_s (DPO) or rows_per_s (KTO) = bs / median step seconds, and TRL's num_tokens/s.
PEER_PREFERENCE = textwrap.dedent("""\
    import argparse, json, time

    import datasets
    import pyarrow as pa
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import DPOConfig, DPOTrainer, KTOConfig, KTOTrainer

    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--rows", required=True)
    p.add_argument("--what", choices=["dpo", "orpo", "kto"], required=True)
    p.add_argument("--arch", default="tiny")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--bs", type=int, default=16)
    p.add_argument("--gc", type=int, default=1)
    a = p.parse_args()
    datasets.disable_caching()
    cuda = torch.cuda.is_available()
    tok = AutoTokenizer.from_pretrained(a.model)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token


    class Timer(TrainerCallback):
        def __init__(self):
            self.rows = []

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and ("num_tokens" in logs or "loss" in logs):  # ORPO logs no num_tokens
                if cuda:
                    torch.cuda.synchronize()
                self.rows.append((time.perf_counter(), float(logs.get("num_tokens", 0))))


    def steady(rows, skip=3):
        r = rows[skip:] if len(rows) > skip + 1 else rows
        d = sorted(r[i][0] - r[i - 1][0] for i in range(1, len(r)))
        return d[len(d) // 2], (r[-1][1] - r[0][1]) / (r[-1][0] - r[0][0])


    rows = [json.loads(line) for line in open(a.rows)]
    ds = Dataset(pa.Table.from_pylist(rows), fingerprint=a.what)
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, target_modules="all-linear", task_type="CAUSAL_LM")
    common = dict(output_dir="/tmp/anchor_out", report_to=[], save_strategy="no", logging_steps=1,
                  bf16=cuda, max_steps=a.steps, disable_tqdm=True, gradient_checkpointing=bool(a.gc))
    torch.manual_seed(0)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    timer = Timer()
    if a.what == "dpo":
        cfg = DPOConfig(per_device_train_batch_size=a.bs, max_length=1024, learning_rate=5e-5, beta=0.1, **common)
        tr = DPOTrainer(model=model, ref_model=None, args=cfg, train_dataset=ds, processing_class=tok,
                        peft_config=lora, callbacks=[timer])
    elif a.what == "orpo":
        from trl.experimental.orpo import ORPOConfig, ORPOTrainer

        cfg = ORPOConfig(per_device_train_batch_size=a.bs, max_length=1024, learning_rate=5e-5, beta=0.1, **common)
        tr = ORPOTrainer(model=model, args=cfg, train_dataset=ds, processing_class=tok, peft_config=lora,
                         callbacks=[timer])
    else:
        cfg = KTOConfig(per_device_train_batch_size=a.bs, max_length=1024, learning_rate=5e-5, beta=0.1, **common)
        tr = KTOTrainer(model=model, ref_model=None, args=cfg, train_dataset=ds, processing_class=tok,
                        peft_config=lora, callbacks=[timer])
    t0 = time.perf_counter(); tr.train(); wall = time.perf_counter() - t0
    s, tps = steady(timer.rows)
    out = dict(what=a.what, arch=a.arch, bs=a.bs, gc=a.gc, step_s=s, tokens_per_s=tps, wall_s=wall,
               steps_timed=len(timer.rows))
    out["rows_per_s" if a.what == "kto" else "pairs_per_s"] = a.bs / s
    if cuda:
        out["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    print(json.dumps(out), flush=True)
    """)


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run_measured(command: list[str], env: dict | None = None) -> tuple[list[str], dict, float]:
    """Run under the PEAK wrapper; returns (stdout lines, peak, wall seconds). Fails loudly with the output."""
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", PEAK, *command], capture_output=True, text=True, env={**os.environ, **(env or {})}
    )
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"failed: {' '.join(command)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    lines = proc.stdout.splitlines()
    peak = next((json.loads(line[5:]) for line in lines if line.startswith("PEAK ")), {})
    return lines, peak, wall


def peak_gib(peak: dict) -> float:
    return peak.get("cuda_gib", peak.get("rss_gib", 0.0))


def anchor(what: str, a, tokenizer_dir: Path) -> dict:
    lines, peak, _ = run_measured(
        [
            str(a.anchor),
            "--tok",
            str(tokenizer_dir),
            "--arch",
            a.arch,
            "--steps",
            str(a.steps),
            "--only",
            what,
            "--bs",
            str(a.bs),
            "--gen_bs",
            str(a.gen_bs),
            "--comp",
            str(a.comp),
            "--gc",
            str(a.anchor_gc),
        ]
    )
    row = json.loads(next(line for line in lines if line.startswith('{"what"')))
    row["peak_gib"] = row.get("peak_gib", peak_gib(peak))
    return row


def peer_preference(what: str, a, model: Path, work: Path) -> dict:
    """The DPO or KTO peer (PEER_PREFERENCE) in its own process, on the rows ours_preference trains on."""
    script = work / "peer_preference.py"
    script.write_text(PEER_PREFERENCE)
    rows = write_jsonl(work / f"{what}.jsonl", PREFERENCE_ROWS[what](a.bs * (a.steps + 2), random.Random(0)))
    lines, peak, _ = run_measured(
        [
            str(script),
            "--model",
            str(model),
            "--rows",
            str(rows),
            "--what",
            what,
            "--arch",
            a.arch,
            "--steps",
            str(a.steps),
            "--bs",
            str(a.bs),
            "--gc",
            str(a.anchor_gc),
        ]
    )
    row = json.loads(next(line for line in lines if line.startswith('{"what"')))
    row["peak_gib"] = row.get("peak_gib", peak_gib(peak))
    return row


def steady(rows: list[dict], skip: int) -> tuple[float, float, int]:
    """(seconds per step, tokens/s, steps) over the logged steps after the first `skip`, as the anchor does.

    Time runs over every logged step; tokens over the rows that carry TRL's num_tokens (GRPO logs it on the steps
    that sampled, so a window of whole sampling rounds counts them right).
    """
    rows = [r for r in rows if r.get("elapsed_s") is not None and r.get("loss") is not None]  # steps, not the summary
    rows = rows[skip:] if len(rows) > skip + 1 else rows
    seconds = rows[-1]["elapsed_s"] - rows[0]["elapsed_s"]
    steps = rows[-1]["step"] - rows[0]["step"]
    counted = [r for r in rows if "num_tokens" in r]
    tokens = counted[-1]["num_tokens"] - counted[0]["num_tokens"] if len(counted) > 1 else 0
    return seconds / max(steps, 1), tokens / seconds if seconds else 0.0, steps


def engine_job(kind: str, model: Path, train: Path, work: Path, args: dict, speed: dict, **extra) -> Path:
    """A worker job file (engine/config/job.py's Job): the stage's settings (its kind's model,
    engine/stages/<kind>/settings.py), the inputs and the speed settings; the worker validates it."""
    out, ckpt = work / "out", work / "ckpt"
    out.mkdir(parents=True)
    settings = {
        "name": kind,
        "kind": kind,
        "dataset": "bench",
        "lora": {"r": 16, "alpha": 32, "dropout": 0.05},
        "args": {
            "logging_steps": 1,
            "save_steps": 10_000,
            "grad_accum": 1,
            "max_seq_len": 1024,
            "warmup_ratio": 0.0,
            **args,
        },
        "n_samples": 1,
        "max_new_tokens": 8,
        **extra,
    }
    job = {
        "settings": settings,
        "inputs": {"model": str(model), "train_file": str(train), "checkpoint_dir": str(ckpt)},
        "output_dir": str(out),
        "speed": speed,
    }
    path = work / "job.json"
    path.write_text(json.dumps(job))
    return path


def ours_sft(a, model: Path, work: Path, packing: str) -> dict:
    train = write_jsonl(work.parent / "sft.jsonl", sft_rows(a.bs * (a.steps + 2), random.Random(0)))
    job = engine_job(
        "sft",
        model,
        train,
        work,
        {"max_steps": a.steps, "batch_size": a.bs, "learning_rate": 2e-4},
        speed_settings(a, packing=packing),
    )
    _, peak, wall = run_measured(["-m", "dragon_dagster.engine.runtime.worker", str(job)])
    step_s, tps, _ = steady(read_progress(work / "out"), skip=3)
    return {
        "what": "sft_packed" if packing == "on" else "sft",
        "step_s": step_s,
        "tokens_per_s": tps,
        "peak_gib": peak_gib(peak),
        "wall_s": wall,
    }


def speed_settings(a, **more) -> dict:
    """Our side's speed settings (the training resource's): --loss-kernel, --torch-compile, each --speed KEY=VALUE."""
    given = {key: int(value) if value.isdigit() else value for key, value in (i.split("=", 1) for i in a.speed)}
    return {"loss_kernel": a.loss_kernel, "torch_compile": a.torch_compile, **more, **given}


def ours_grpo(a, model: Path, work: Path) -> dict:
    train = write_jsonl(work.parent / "prompts.jsonl", grpo_rows(a.gen_bs * (a.steps + 2), random.Random(0)))
    rewards = [{"type": "numeric", "weight": 1.0}, {"type": "length", "max_chars": 12, "weight": 1.0}]
    job = engine_job(
        "grpo",
        model,
        train,
        work,
        {"max_steps": a.steps, "batch_size": a.gen_bs // 8, "learning_rate": 1e-5},
        speed_settings(a, generation_batch_size=a.gen_rounds * a.gen_bs or None),
        rewards=rewards,
        group_size=8,
        beta=0.04,
        temperature=1.0,
        max_eval_prompts=2,
        max_new_tokens=a.comp,
    )
    _, peak, wall = run_measured(["-m", "dragon_dagster.engine.runtime.worker", str(job)])
    rows = read_progress(work / "out")
    step_s, tps, _ = steady(rows, skip=2)
    lengths = [r["completion_len"] for r in rows if "completion_len" in r]
    mean_len = statistics.mean(lengths) if lengths else float(a.comp)
    return {
        "what": "grpo",
        "step_s": step_s,
        "completions_per_s": a.gen_bs / step_s,
        "completion_tokens_per_s": a.gen_bs * mean_len / step_s,
        "all_tokens_per_s": tps,
        "mean_completion_len": mean_len,
        "peak_gib": peak_gib(peak),
        "wall_s": wall,
    }


def ours_preference(what: str, a, model: Path, work: Path) -> dict:
    """The same rows through the worker's preference stage (kind dpo or kto); rows/s from the median step."""
    rows = write_jsonl(work.parent / f"{what}.jsonl", PREFERENCE_ROWS[what](a.bs * (a.steps + 2), random.Random(0)))
    job = engine_job(
        what,
        model,
        rows,
        work,
        {"max_steps": a.steps, "batch_size": a.bs, "learning_rate": 5e-5},
        speed_settings(a),
        beta=0.1,
    )
    _, peak, wall = run_measured(["-m", "dragon_dagster.engine.runtime.worker", str(job)])
    progress = [r for r in read_progress(work / "out") if r.get("elapsed_s") is not None]
    tps = steady(progress, skip=3)[1] if any("num_tokens" in r for r in progress) else None
    # the median step, as the anchor's steady takes it: elapsed_s between consecutive logged steps
    timed = [r for r in progress if "num_tokens" in r] or progress
    timed = timed[3:] if len(timed) > 4 else timed
    gaps = sorted(
        (later["elapsed_s"] - before["elapsed_s"]) / (later["step"] - before["step"])
        for before, later in zip(timed, timed[1:])
        if later["step"] > before["step"]
    )
    step_s = gaps[len(gaps) // 2]
    summary = work / "out" / "metrics.json"  # the worker's summary names the speed choices it resolved
    speed = json.loads(summary.read_text()).get("speed") if summary.exists() else None
    return {
        "what": what,
        "step_s": step_s,
        "tokens_per_s": tps,
        "pairs_per_s" if what in PAIRED else "rows_per_s": a.bs / step_s,
        "peak_gib": peak_gib(peak),
        "wall_s": wall,
        "steps_timed": len(timed),
        "speed": speed,
    }


def read_progress(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "progress.jsonl").read_text().splitlines()]


def sft_pipeline_yaml(work: Path, model: Path, n_rows: int, steps: int, batch: int, more_args: str = "") -> Path:
    """A one-stage SFT pipeline on n_rows of the peer's rows (a CSV beside it), as a user writes one."""
    import pandas as pd

    rows = sft_rows(n_rows, random.Random(1))
    csv = work / "rows.csv"
    pd.DataFrame(
        {"question": [r["prompt"][0]["content"] for r in rows], "answer": [r["completion"][0]["content"] for r in rows]}
    ).to_csv(csv, index=False)
    spec = work / "bench.yaml"
    spec.write_text(
        textwrap.dedent(f"""\
        name: bench
        model: {model}
        datasets: {{rows: {{path: "{csv}"}}}}
        stages:
          - {{name: sft_dataset, kind: chat_dataset, source: rows, prompt: question, response: answer}}
          - {{name: sft_adapter, kind: sft, dataset: sft_dataset, n_samples: 1, max_new_tokens: 4,
              args: {{max_steps: {steps}, batch_size: {batch}, grad_accum: 1, max_seq_len: 256,
                     logging_steps: 1{more_args}}}}}
        """)
    )
    return spec


def dagster_overhead(a, model: Path, work: Path) -> dict:
    """Materialize a one-stage SFT pipeline through Dagster, then run its own job file straight through the
    worker; the difference is what Dagster adds (run, Pipes, MLflow, artifact store). Best of a.repeats."""
    from dagster import AssetSelection, DagsterInstance, materialize

    from dragon_dagster.assets.factory import build_pipeline_defs
    from dragon_dagster.engine.config.job import absolute_paths
    from dragon_dagster.engine.pipeline import load as load_pipeline
    from dragon_dagster.engine.runtime.execution import load_job
    from dragon_dagster.resources import ArtifactStore, MLflowTracking, TrainingResource

    spec = sft_pipeline_yaml(work, model, n_rows=64, steps=2, batch=2)
    parts = build_pipeline_defs(load_pipeline(spec))
    runs = work / "runs"
    resources = {
        "store": ArtifactStore(runs_dir=str(runs)),
        "tracking": MLflowTracking(runs_dir=str(runs)),
        "training": TrainingResource(device=a.device),
    }
    (work / "home").mkdir()
    instance = DagsterInstance.local_temp(str(work / "home"))

    def run(*assets: str) -> tuple[float, str]:
        start = time.perf_counter()
        result = materialize(
            parts["assets"],
            instance=instance,
            resources=resources,
            selection=AssetSelection.assets(*[["bench", asset] for asset in assets]),
        )
        wall = time.perf_counter() - start
        event = result.get_asset_materialization_events()[-1].event_specific_data.materialization
        return wall, event.metadata["artifact_dir"].value

    run("rows", "sft_dataset")
    dagster_s, direct_s = [], []
    for i in range(a.repeats):
        wall, artifact = run("sft_adapter")
        dagster_s.append(wall)
        # the very job Dagster ran; its paths into the artifact are relative to it
        job, _ = load_job(json.loads((Path(artifact) / "job.json").read_text()))
        job = absolute_paths(job, artifact)
        direct = work / f"direct{i}"
        (direct / "out").mkdir(parents=True)
        inputs = job.inputs.model_copy(update={"checkpoint_dir": str(direct / "ckpt")})
        job = job.model_copy(update={"output_dir": str(direct / "out"), "inputs": inputs})
        (direct / "job.json").write_text(job.model_dump_json())
        _, _, wall = run_measured(["-m", "dragon_dagster.engine.runtime.worker", str(direct / "job.json")])
        direct_s.append(wall)
    return {
        "what": "dagster_overhead",
        "materialize_s": min(dagster_s),
        "engine_direct_s": min(direct_s),
        "overhead_s": min(dagster_s) - min(direct_s),
        "runs": a.repeats,
    }


def ratio(ours: float | None, theirs: float | None) -> str:
    return f"{ours / theirs:.2f}x" if ours and theirs else "-"


def report(measured: dict[str, dict], a) -> str:
    lines = ["| measurement | plain TRL | dragon-dagster | ratio |", "|---|---|---|---|"]

    def add(label, key, ours, theirs, fmt="{:,.0f}", lower_is_better=False):
        o, t = (ours or {}).get(key), (theirs or {}).get(key)
        r = ratio(t, o) if lower_is_better else ratio(o, t)
        lines.append(
            f"| {label} | {fmt.format(t) if t is not None else '-'} | {fmt.format(o) if o is not None else '-'} | {r} |"
        )

    for what in ("sft", "sft_packed"):
        ours, theirs = measured.get(f"ours_{what}"), measured.get(f"trl_{what}")
        add(f"{what} trained tokens/s", "tokens_per_s", ours, theirs)
        add(f"{what} peak GiB (TRL / ours)", "peak_gib", ours, theirs, "{:.2f}", lower_is_better=True)
    ours, theirs = measured.get("ours_grpo"), measured.get("trl_grpo")
    add("grpo completions/s", "completions_per_s", ours, theirs, "{:.2f}")
    add("grpo completion tokens/s", "completion_tokens_per_s", ours, theirs)
    add("grpo peak GiB (TRL / ours)", "peak_gib", ours, theirs, "{:.2f}", lower_is_better=True)
    for what, unit in (("dpo", "pairs"), ("orpo", "pairs"), ("kto", "rows")):
        ours, theirs = measured.get(f"ours_{what}"), measured.get(f"trl_{what}")
        add(f"{what} {unit}/s", f"{unit}_per_s", ours, theirs, "{:.2f}")
        add(f"{what} trained tokens/s", "tokens_per_s", ours, theirs)
        add(f"{what} peak GiB (TRL / ours)", "peak_gib", ours, theirs, "{:.2f}", lower_is_better=True)
    overhead = measured.get("dagster_overhead")
    if overhead:
        lines.append(
            f"| Dagster overhead per materialization | - | {overhead['overhead_s']:.2f} s "
            f"({overhead['materialize_s']:.1f} s vs {overhead['engine_direct_s']:.1f} s direct) | - |"
        )
    return "\n".join(lines)


def machine() -> dict:
    import peft
    import torch
    import transformers
    import trl

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores" + (f", {gpu}" if gpu else ""),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "trl": trl.__version__,
        "peft": peft.__version__,
        "torch_threads": torch.get_num_threads(),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--arch", default="tiny", choices=["tiny", "smol", "qwen05"])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--bs", type=int, default=16, help="SFT rows per step (both sides)")
    p.add_argument("--gen-bs", dest="gen_bs", type=int, default=16, help="GRPO completions per step (8 per prompt)")
    p.add_argument("--comp", type=int, default=32, help="GRPO max completion tokens")
    p.add_argument(
        "--gen-rounds",
        dest="gen_rounds",
        type=int,
        default=0,
        help="ours: steps served by one generation round (generation_batch_size = rounds x gen-bs); "
        "0 or 1: one step's, on-policy, as the peer",
    )
    p.add_argument("--loss-kernel", dest="loss_kernel", default="auto", choices=["auto", "chunked", "trl"])
    p.add_argument("--torch-compile", dest="torch_compile", action="store_true", help="ours: torch.compile the model")
    p.add_argument(
        "--speed",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="ours: another speed setting, e.g. unpad=off, dropout_mask=torch, sampling=trl (repeatable)",
    )
    p.add_argument("--anchor-gc", dest="anchor_gc", type=int, default=1, help="the peer's gradient checkpointing")
    p.add_argument("--only", default="sft,sft_packed,grpo,dpo,orpo,kto,dagster_overhead")
    p.add_argument("--repeats", type=int, default=2, help="Dagster overhead: materializations to take the best of")
    p.add_argument(
        "--skip-peer",
        dest="skip_peer",
        action="store_true",
        help="measure this project only (for shapes where the peer runs out of memory)",
    )
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    p.add_argument("--anchor", type=Path, default=ANCHOR)
    p.add_argument("--tok", type=Path, help="tokenizer directory (default: the embedded SmolLM2's)")
    p.add_argument("--json", type=Path, help="also write every measurement here")
    a = p.parse_args()
    if not a.anchor.exists():
        raise SystemExit(f"the peer script {a.anchor} is missing: pass --anchor PATH")

    if a.tok is None:
        from dragon_dagster.engine.models import embedded_model_dir

        a.tok = embedded_model_dir()
    tokenizer_dir = a.tok
    only = a.only.split(",")
    measured: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="dragon-bench-") as tmp:
        work = Path(tmp)
        model = random_model(a.arch, tokenizer_dir, work / "model")
        for what in ("sft", "sft_packed", "grpo"):
            if what not in only:
                continue
            if not a.skip_peer:
                measured[f"trl_{what}"] = anchor(what, a, tokenizer_dir)
                print(json.dumps({"side": "trl", **measured[f"trl_{what}"]}), flush=True)
            run_dir = work / f"ours_{what}"
            run_dir.mkdir()
            ours = (
                ours_grpo(a, model, run_dir / "w")
                if what == "grpo"
                else ours_sft(a, model, run_dir / "w", "on" if what == "sft_packed" else "off")
            )
            measured[f"ours_{what}"] = ours
            print(json.dumps({"side": "dragon-dagster", **ours}), flush=True)
            shutil.rmtree(run_dir, ignore_errors=True)
        for what in ("dpo", "orpo", "kto"):
            if what not in only:
                continue
            run_dir = work / f"{what}"
            run_dir.mkdir()
            if not a.skip_peer:
                measured[f"trl_{what}"] = peer_preference(what, a, model, run_dir)
                print(json.dumps({"side": "trl", **measured[f"trl_{what}"]}), flush=True)
            measured[f"ours_{what}"] = ours_preference(what, a, model, run_dir / "w")
            print(json.dumps({"side": "dragon-dagster", **measured[f"ours_{what}"]}), flush=True)
            shutil.rmtree(run_dir, ignore_errors=True)
        if "dagster_overhead" in only:
            overhead_dir = work / "overhead"
            overhead_dir.mkdir()
            measured["dagster_overhead"] = dagster_overhead(a, model, overhead_dir)
            print(json.dumps(measured["dagster_overhead"]), flush=True)
    info = {**machine(), "args": vars(a) | {"anchor": str(a.anchor), "tok": str(a.tok), "json": None}}
    print(json.dumps(info))
    print(report(measured, a))
    if a.json:
        a.json.write_text(json.dumps({"machine": info, "measured": measured}, indent=2, default=str))


if __name__ == "__main__":
    main()
