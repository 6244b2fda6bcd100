"""This project's training paths against plain TRL at its best, the same work on both sides, in interleaved rounds.

    python benchmarks/compare_trl.py --arch smol                       # the RESULTS headline (CPU: about an hour)
    python benchmarks/compare_trl.py --arch smol --explore --only sft  # every candidate peer option once
    python benchmarks/compare_trl.py                                   # the tiny shape, a few minutes

The peer is benchmarks/peer_trl.py: TRL 1.16 as its docs show it, with the options in PEER_BEST (the fastest
that --explore found on the machine RESULTS names, among CANDIDATES). The same work on both sides:

- the same saved random-weight model (the shapes of shapes.py's arch_config), the same rows file per method, read in the
  same order (both sides use the Trainer's sampler with seed 42; KTO's rows are shuffled with seed 42 on both);
- the same objective: SFT on the reply only (prompt-completion rows), DPO/ORPO/KTO with beta 0.1, GRPO with 8
  completions per prompt, the same completion length, beta 0.04 (a reference pass every step), on-policy;
- the same LoRA: r 16, alpha 32, every linear layer, dropout 0 in the headline. With dropout on, the two differ
  by design (ours samples GRPO's completions without dropout; see --second-rows), so those are second rows;
- the same learning rates, no warm-up, no gradient checkpointing on either side.

Each run is its own process (its peak memory is its own); each round runs every measurement on both sides, the
side that goes first alternating between rounds. Printed: one JSON line per run, then per measurement each
side's median (min-max) over the rounds and the ratio of the medians. --limits also measures the machine's
matmul peak and memory bandwidth (benchmarks/limits.py) and reports how close SFT and GRPO sampling come.
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
from dataclasses import dataclass
from pathlib import Path

from shapes import arch_config

ROOT = Path(__file__).resolve().parents[1]
PEER = ROOT / "benchmarks" / "peer_trl.py"
METHODS = ("sft", "dpo", "orpo", "kto", "grpo")

# The peer options tried per method (peer_trl.py's flags; gradient checkpointing is off in all of them). TRL 1.16
# has no padding-free DPO (it "warns and falls back"), ORPO has no speed options, and Liger kernels need a GPU.
CANDIDATES: dict[str, list[list[str]]] = {
    "sft": [[], ["padding_free"], ["packing"], ["workers=2"], ["torch_compile"]],
    "dpo": [[], ["precompute_ref"]],
    "orpo": [[]],
    "kto": [[], ["precompute_ref"]],
    "grpo": [[]],
}
# The fastest of CANDIDATES on the RESULTS machine (2-core CPU), from `--explore` (RESULTS, "The peer at its best":
# the SFT options within noise of each other, the fastest run kept); --peer METHOD=... or --peer-from overrides.
PEER_BEST: dict[str, list[str]] = {
    "sft": ["workers=2"],
    "dpo": ["precompute_ref"],
    "orpo": [],
    "kto": ["precompute_ref"],
    "grpo": [],
}


@dataclass(frozen=True)
class Measurement:
    """One row of the table: a method, the LoRA dropout on both sides and GRPO's steps per sampling round."""

    method: str
    dropout: float = 0.0
    rounds: int = 1

    @property
    def label(self) -> str:
        return (
            self.method
            + (f" dropout {self.dropout}" if self.dropout else "")
            + (f" {self.rounds} steps per sampling round" if self.rounds > 1 else "")
        )


SECOND_ROWS = {
    "sft_dropout": Measurement("sft", dropout=0.05),
    "grpo_dropout": Measurement("grpo", dropout=0.05),
    "grpo_rounds4": Measurement("grpo", rounds=4),
}

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


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run_measured(
    command: list[str], env: dict | None = None, timeout: float | None = None
) -> tuple[list[str], dict, float]:
    """Run under the PEAK wrapper; returns (stdout lines, peak, wall seconds). Fails loudly with the output."""
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", PEAK, *command],
            capture_output=True,
            text=True,
            env={**os.environ, **(env or {})},
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        raise SystemExit(f"gave up after {timeout:.0f} s: {' '.join(command)}") from None
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"failed: {' '.join(command)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    lines = proc.stdout.splitlines()
    peak = next((json.loads(line[5:]) for line in lines if line.startswith("PEAK ")), {})
    return lines, peak, wall


def peak_gib(peak: dict) -> float:
    return peak.get("cuda_gib", peak.get("rss_gib", 0.0))


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


def engine_job(
    kind: str, model: Path, train: Path, work: Path, args: dict, speed: dict, dropout: float, **extra
) -> Path:
    """A worker job file (engine/config/job.py's Job): the stage's settings (its kind's model,
    engine/stages/<kind>/settings.py), the inputs and the speed settings; the worker validates it."""
    out, ckpt = work / "out", work / "ckpt"
    out.mkdir(parents=True)
    settings = {
        "name": kind,
        "kind": kind,
        "dataset": "bench",
        "lora": {"r": 16, "alpha": 32, "dropout": dropout},
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


def speed_settings(a, **more) -> dict:
    """Our side's speed settings (the training resource's): --loss-kernel, --torch-compile, each --speed KEY=VALUE."""
    given = {key: int(value) if value.isdigit() else value for key, value in (i.split("=", 1) for i in a.speed)}
    return {"loss_kernel": a.loss_kernel, "torch_compile": a.torch_compile, **more, **given}


def ours(m: Measurement, a, model: Path, rows: Path, work: Path) -> dict:
    """One measurement through this project's worker (python -m dragon_dagster.engine.runtime.worker job.json)."""
    if m.method == "grpo":
        rewards = [{"type": "numeric", "weight": 1.0}, {"type": "length", "max_chars": 12, "weight": 1.0}]
        extra = dict(rewards=rewards, group_size=8, beta=0.04, temperature=1.0, max_eval_prompts=2)
        extra["max_new_tokens"] = a.comp
        args = {"max_steps": a.grpo_steps, "batch_size": a.gen_bs // 8, "learning_rate": 1e-5}
        speed = speed_settings(a, generation_batch_size=m.rounds * a.gen_bs if m.rounds > 1 else None)
    elif m.method == "sft":
        extra, speed = {}, speed_settings(a)  # the resource's default packing: off on a CPU
        args = {"max_steps": a.steps, "batch_size": a.bs, "learning_rate": 2e-4}
    else:
        extra, speed = {"beta": 0.1}, speed_settings(a)
        args = {"max_steps": a.pref_steps, "batch_size": a.bs, "learning_rate": 5e-5}
    job = engine_job(m.method, model, rows, work, args, speed, m.dropout, **extra)
    _, peak, wall = run_measured(["-m", "dragon_dagster.engine.runtime.worker", str(job)])
    progress = [r for r in read_progress(work / "out") if r.get("elapsed_s") is not None and r.get("loss") is not None]
    times = [r["elapsed_s"] for r in progress]
    gaps = [later - before for before, later in zip(times, times[1:])]
    out = {"side": "ours", "wall_s": wall, "peak_gib": peak_gib(peak), "losses": [r["loss"] for r in progress]}
    if m.method == "grpo":  # whole sampling rounds: the mean step over every step from the --skip-th
        window = gaps[a.grpo_skip :]
        out["step_s"] = sum(window) / len(window)
        lengths = [r["completion_len"] for r in progress if "completion_len" in r]
        out["mean_completion_len"] = statistics.mean(lengths) if lengths else float(a.comp)
    else:
        out["step_s"] = statistics.median(gaps[a.skip :] or gaps)
    counted = [r for r in progress[a.skip :] if "num_tokens" in r]
    if len(counted) > 1:
        seconds = counted[-1]["elapsed_s"] - counted[0]["elapsed_s"]
        out["tokens_per_s"] = (counted[-1]["num_tokens"] - counted[0]["num_tokens"]) / seconds if seconds else None
    summary = work / "out" / "metrics.json"  # the worker's summary names the speed choices it resolved
    if summary.exists():
        out["speed"] = json.loads(summary.read_text()).get("speed")
    return out


def peer(m: Measurement, a, model: Path, rows: Path, options: list[str]) -> dict:
    """One measurement of plain TRL (benchmarks/peer_trl.py) with the given options, in its own process."""
    steps = {"sft": a.steps, "grpo": a.grpo_steps}.get(m.method, a.pref_steps)
    command = [
        str(PEER),
        "--method",
        m.method,
        "--model",
        str(model),
        "--rows",
        str(rows),
        "--steps",
        str(steps),
        "--bs",
        str(a.gen_bs if m.method == "grpo" else a.bs),
        "--comp",
        str(a.comp),
        "--lora-dropout",
        str(m.dropout),
        "--skip",
        str(a.grpo_skip if m.method == "grpo" else a.skip),
        "--gc",
        str(a.peer_gc),
    ]
    for option in options:
        name, _, value = option.partition("=")
        command += [f"--{name.replace('_', '-')}"] + ([value] if value else [])
    if m.rounds > 1:
        command += ["--steps-per-generation", str(m.rounds)]
    lines, peak, wall = run_measured(command, timeout=a.peer_timeout)
    row = json.loads(next(line for line in lines if line.startswith('{"method"')))
    return {"side": "peer", **row, "wall_s": wall, "peak_gib": row.get("peak_gib", peak_gib(peak))}


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


def unit(method: str) -> tuple[str, str]:
    """The headline figure of a method: (its name, the key or rule that computes it)."""
    return {
        "sft": ("trained tokens/s", "tokens"),
        "dpo": ("pairs/s", "rows"),
        "orpo": ("pairs/s", "rows"),
        "kto": ("rated replies/s", "rows"),
        "grpo": ("completions/s", "completions"),
    }[method]


def figure(m: Measurement, run: dict, a) -> float | None:
    """The headline figure of one run: tokens/s for SFT, rows (pairs, replies, completions) per second otherwise.
    A peer option that works before the first step (precomputed references) has that time spread over its steps."""
    rule = unit(m.method)[1]
    if rule == "tokens":
        return run.get("tokens_per_s")
    step = run.get("step_s_with_setup") or run["step_s"]
    return (a.gen_bs if rule == "completions" else a.bs) / step


def spread(values: list[float]) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    fmt = "{:,.0f}" if max(values) >= 20 else "{:.2f}"
    med = fmt.format(statistics.median(values))
    return med if len(values) == 1 else f"{med} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def report(runs: list[dict], plan: list[Measurement], a) -> str:
    """Markdown: per measurement, each side's median (min-max) over the rounds and the ratio of the medians."""
    lines = [
        "| measurement | plain TRL at its best | dragon-dagster | ratio of medians | rounds |",
        "|---|---|---|---|---|",
    ]
    for m in plan:
        mine = [r for r in runs if r["measurement"] == m.label]
        peer_values = [figure(m, r, a) for r in mine if r["side"] == "peer"]
        our_values = [figure(m, r, a) for r in mine if r["side"] == "ours"]
        peer_values, our_values = [v for v in peer_values if v], [v for v in our_values if v]
        ratio = (
            f"**{statistics.median(our_values) / statistics.median(peer_values):.2f}x**"
            if peer_values and our_values
            else "-"
        )
        lines.append(
            f"| {m.label}: {unit(m.method)[0]} | {spread(peer_values)} | {spread(our_values)} | {ratio} |"
            f" {min(len(peer_values), len(our_values))} |"
        )
        peaks = {side: [r["peak_gib"] for r in mine if r["side"] == side] for side in ("peer", "ours")}
        if peaks["peer"] and peaks["ours"]:
            less = statistics.median(peaks["peer"]) / statistics.median(peaks["ours"])
            lines.append(
                f"| {m.label}: peak memory, GiB | {spread(peaks['peer'])} | {spread(peaks['ours'])} |"
                f" {less:.2f}x less | |"
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
        "cpu": next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            platform.processor(),
        )
        if Path("/proc/cpuinfo").exists()
        else platform.processor(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "trl": trl.__version__,
        "peft": peft.__version__,
        "torch_threads": torch.get_num_threads(),
    }


def rows_file(method: str, a, work: Path) -> Path:
    """The rows both sides train on, one file per method: exactly the rows the steps take (GRPO: the prompts)."""
    steps = {"sft": a.steps, "grpo": a.grpo_steps}.get(method, a.pref_steps)
    n = steps * (a.gen_bs // 8 if method == "grpo" else a.bs)
    generator = {"sft": sft_rows, "dpo": dpo_rows, "orpo": dpo_rows, "kto": kto_rows, "grpo": grpo_rows}[method]
    path = work / f"{method}.jsonl"
    if not path.exists():
        write_jsonl(path, generator(n, random.Random(0)))
    return path


def parse_peer_options(given: list[str], explored: Path | None = None) -> dict[str, list[str]]:
    """The peer's options per method: PEER_BEST, or the fastest per method in an --explore JSON (--peer-from),
    then each --peer METHOD=OPT[+OPT...] ('none': no options)."""
    chosen = {method: list(options) for method, options in PEER_BEST.items()}
    if explored:
        runs = [r for r in json.loads(explored.read_text())["runs"] if r["side"] == "peer" and r.get("figure")]
        for method in METHODS:
            tried = [r for r in runs if r["method"] == method]
            if tried:
                chosen[method] = max(tried, key=lambda r: r["figure"])["options"]
    for item in given:
        method, _, options = item.partition("=")
        chosen[method] = [] if options in ("", "none") else options.split("+")
    return chosen


def measure(m: Measurement, side: str, a, model: Path, work: Path, options: list[str], tag: str) -> dict:
    rows = rows_file(m.method, a, work)
    if side == "peer":
        run = peer(m, a, model, rows, options)
    else:
        run_dir = work / f"ours-{tag}"
        shutil.rmtree(run_dir, ignore_errors=True)
        run = ours(m, a, model, rows, run_dir)
        shutil.rmtree(run_dir, ignore_errors=True)
    run.update(measurement=m.label, method=m.method, tag=tag)
    run["figure"] = figure(m, run, a)
    print(json.dumps(run, default=str), flush=True)
    return run


def explore(a, model: Path, work: Path, methods: list[str]) -> list[dict]:
    """Each candidate option set of the peer once: what RESULTS lists as tried."""
    runs = []
    for method in methods:
        m = Measurement(method)
        for options in [t.split("+") for t in a.try_options] or CANDIDATES[method]:
            tag = f"explore-{method}-{'+'.join(options) or 'none'}"
            try:
                run = measure(m, "peer", a, model, work, options, tag)
            except SystemExit as failed:  # an option this TRL or device refuses: recorded, not fatal
                run = {"measurement": m.label, "side": "peer", "tag": tag, "failed": str(failed)[-1500:]}
                print(json.dumps(run), flush=True)
            run["options"] = options
            runs.append(run)
    lines = ["| method | peer options | figure | step s |", "|---|---|---|---|"]
    for run in runs:
        label = "ours" if run["side"] == "ours" else "+".join(run.get("options") or []) or "no options"
        value = run.get("figure")
        lines.append(
            f"| {run['measurement']} | {label} | {value:,.2f} | {run.get('step_s', 0):.2f} |"
            if value
            else f"| {run['measurement']} | {label} | failed | - |"
        )
    print("\n".join(lines))
    return runs


def tokens(tokenizer, messages: list[dict], **kw) -> int:
    """How many tokens the chat template makes of messages (transformers 5 returns a dict by default)."""
    return len(tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True, **kw)["input_ids"])


def sft_shape(a) -> tuple[float, float]:
    """The SFT rows' mean tokenized length and the share of their tokens that are trained (the reply's)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(a.tok)
    rows = sft_rows(a.bs * a.steps, random.Random(0))
    whole = [tokens(tokenizer, r["prompt"] + r["completion"]) for r in rows]
    prompt = [tokens(tokenizer, r["prompt"], add_generation_prompt=True) for r in rows]
    return statistics.mean(whole), 1 - sum(prompt) / sum(whole)


def limits_report(limits: dict, runs: list[dict], a) -> str:
    """How close to the machine's limits: SFT's achieved matmul FLOP/s against the matmul peak (FLOPs per trained
    token counted by limits.sft_flops_per_token), and GRPO sampling's weight bytes read per second against the
    memory bandwidth (limits.sampling, the smol shape's 8 rows x 32 tokens through this project's sampler)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import limits as machine_limits

    peak, bandwidth = limits["matmul_peak"]["gflop_s"], limits["memory_bandwidth"]["read_gb_s"]
    lines = [f"- Machine: float32 matmul peak {peak:,.0f} GFLOP/s, memory bandwidth (read) {bandwidth:,.1f} GB/s"]
    for side in ("ours", "peer"):
        sft = [r["figure"] for r in runs if r.get("measurement") == "sft" and r["side"] == side and r.get("figure")]
        if sft and a.arch == "smol":
            length, scored = sft_shape(a)
            # TRL's num_tokens counts prompt and reply: the FLOPs of a token through the model, the head's share
            # only on the scored (reply) positions, which both sides' objective trains
            flops = machine_limits.sft_flops_per_token(length, scored)
            achieved = statistics.median(sft) * flops / 1e9
            lines.append(
                f"- SFT ({side}, median {statistics.median(sft):,.0f} tokens/s, {flops / 1e9:.2f} GFLOP a token at "
                f"{length:.0f} tokens a row, {scored:.0%} scored): {achieved:,.1f} GFLOP/s = {achieved / peak:.0%} "
                "of the matmul peak"
            )
    sampling = limits.get("grpo_sampling")
    if sampling:
        lines.append(
            f"- GRPO sampling (ours, {sampling['rows']} rows x {sampling['new_tokens']} tokens, median of "
            f"{len(sampling['call_seconds'])} calls): {sampling['call_weight_gb_s']:,.1f} GB/s of weights over the "
            f"whole call = {sampling['call_weight_gb_s'] / bandwidth:.0%} of the bandwidth; "
            f"{sampling['step_weight_gb_s']:,.1f} GB/s over the decoding steps alone = "
            f"{sampling['step_weight_gb_s'] / bandwidth:.0%} ({sampling.get('bound', '')}-bound at "
            f"{sampling['arithmetic_intensity_flop_per_byte']} FLOP/byte)"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--arch", default="tiny", choices=["tiny", "smol", "qwen05"])
    p.add_argument("--only", default="sft,dpo,orpo,kto,grpo", help="methods, and dagster_overhead")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds of every measurement")
    p.add_argument("--steps", type=int, default=8, help="SFT steps per run")
    p.add_argument("--pref-steps", dest="pref_steps", type=int, default=6, help="DPO, ORPO and KTO steps per run")
    p.add_argument("--grpo-steps", dest="grpo_steps", type=int, default=6, help="GRPO steps per run")
    p.add_argument("--skip", type=int, default=2, help="logged steps left out of the timing (warm-up)")
    p.add_argument("--grpo-skip", dest="grpo_skip", type=int, default=2)
    p.add_argument("--bs", type=int, default=4, help="rows (pairs, rated replies) per step, both sides")
    p.add_argument("--gen-bs", dest="gen_bs", type=int, default=8, help="GRPO completions per step (8 per prompt)")
    p.add_argument("--comp", type=int, default=32, help="GRPO max completion tokens")
    p.add_argument(
        "--second-rows",
        dest="second_rows",
        default="",
        help="comma list of extra measurements: sft_dropout, grpo_dropout (LoRA dropout 0.05 both sides: ours samples "
        "without it by design), grpo_rounds4 (one sampling round per 4 steps on both sides)",
    )
    p.add_argument("--peer", action="append", default=[], metavar="METHOD=OPT[+OPT]", help="peer options per method")
    p.add_argument(
        "--peer-from", dest="peer_from", type=Path, help="take the fastest peer options from --explore's JSON"
    )
    p.add_argument(
        "--skip-peer", dest="skip_peer", action="store_true", help="this project only (shapes the peer cannot fit)"
    )
    p.add_argument("--peer-gc", dest="peer_gc", type=int, default=0, help="the peer's gradient checkpointing")
    p.add_argument("--explore", action="store_true", help="run every candidate peer option once instead")
    p.add_argument(
        "--try", dest="try_options", action="append", default=[], metavar="OPT[+OPT]", help="--explore only these"
    )
    p.add_argument("--peer-timeout", dest="peer_timeout", type=float, default=None, help="seconds a peer run may take")
    p.add_argument("--limits", action="store_true", help="also measure the machine's limits (benchmarks/limits.py)")
    p.add_argument("--loss-kernel", dest="loss_kernel", default="auto", choices=["auto", "chunked", "trl"])
    p.add_argument("--torch-compile", dest="torch_compile", action="store_true", help="ours: torch.compile the model")
    p.add_argument("--speed", action="append", default=[], metavar="KEY=VALUE", help="ours: another speed setting")
    p.add_argument("--repeats", type=int, default=2, help="Dagster overhead: materializations to take the best of")
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    p.add_argument("--tok", type=Path, help="tokenizer directory (default: the embedded SmolLM2's)")
    p.add_argument("--json", type=Path, help="also write every run here")
    a = p.parse_args()

    if a.tok is None:
        from dragon_dagster.engine.models import embedded_model_dir

        a.tok = embedded_model_dir()
    only = a.only.split(",")
    methods = [m for m in METHODS if m in only]
    plan = [Measurement(method) for method in methods]
    plan += [SECOND_ROWS[name] for name in a.second_rows.split(",") if name]
    options = parse_peer_options(a.peer, a.peer_from)
    info = {**machine(), "args": vars(a) | {"tok": str(a.tok), "json": str(a.json)}, "peer_options": options}
    print(json.dumps(info, default=str), flush=True)
    runs: list[dict] = []
    extra: dict = {}
    with tempfile.TemporaryDirectory(prefix="dragon-bench-") as tmp:
        work = Path(tmp)
        model = random_model(a.arch, a.tok, work / "model")
        if a.limits:
            run_measured([str(ROOT / "benchmarks" / "limits.py"), "--runs", "5", "--json", str(work / "limits.json")])
            extra["limits"] = json.loads((work / "limits.json").read_text())
            print(json.dumps({"limits": extra["limits"]}), flush=True)
        if a.explore:
            runs = explore(a, model, work, methods)
        else:
            # rounds alternate which side goes first, so a drift of the machine's speed hits both alike
            for round_ in range(a.rounds):
                for m in plan:
                    sides = ("peer", "ours") if round_ % 2 == 0 else ("ours", "peer")
                    sides = tuple(side for side in sides if side == "ours" or not a.skip_peer)
                    for side in sides:
                        runs.append(measure(m, side, a, model, work, options[m.method], f"{m.label}-{round_}"))
        if "dagster_overhead" in only:
            overhead_dir = work / "overhead"
            overhead_dir.mkdir()
            extra["dagster_overhead"] = dagster_overhead(a, model, overhead_dir)
            print(json.dumps(extra["dagster_overhead"]), flush=True)
    if not a.explore:
        print(report(runs, plan, a))
    if "limits" in extra:
        print(limits_report(extra["limits"], runs, a))
    if "dagster_overhead" in extra:
        o = extra["dagster_overhead"]
        print(
            f"Dagster overhead per materialization: {o['overhead_s']:.2f} s ({o['materialize_s']:.1f} s against "
            f"{o['engine_direct_s']:.1f} s straight through the worker)"
        )
    if a.json:
        a.json.write_text(json.dumps({"machine": info, "runs": runs, **extra}, indent=2, default=str))


if __name__ == "__main__":
    main()
