"""GRPO's loss types compared: grpo_learning.py once per (loss type, training seed), interleaved, two at a time.
The type `rloo` is the rloo kind (TRL's RLOOTrainer) on the same settings: RLOO against GRPO at the same steps.

Every run trains the same settings on the same prompts and scores the same 64 held-out prompts (the held-out
split's seed is fixed; only the training seed varies), so the loss types compare paired: per type, the held-out
numeric accuracy after training (median and range over the seeds) and its gain over the start, and between two
types an exact McNemar test on the prompts pooled over the seeds (each seed's prompt once per seed).

    .venv/bin/python benchmarks/grpo_loss_types.py                          # grpo, dr_grpo, dapo x seeds 1-3
    .venv/bin/python benchmarks/grpo_loss_types.py --types grpo,dapo --seeds 1,2 -- --profile quick
    .venv/bin/python benchmarks/grpo_loss_types.py --types grpo,rloo       # RLOO against GRPO, seeds 1-3

Arguments after `--` go to every grpo_learning.py run. One JSON line on stdout; each run's own line is kept in
<out>/runs.jsonl as it finishes.
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from feedback_learning import mcnemar  # noqa: E402 - the same exact test as the feedback benchmark


def run(loss_type: str, seed: int, out: Path, extra: list[str]) -> dict:
    started = time.time()
    command = [
        sys.executable,
        str(ROOT / "benchmarks" / "grpo_learning.py"),
        *(["--kind", "rloo"] if loss_type == "rloo" else ["--loss-type", loss_type]),
        "--train-seed",
        str(seed),
        "--long-eval-tokens",
        "0",
        "--out",
        str(out / f"{loss_type}-seed{seed}"),
        *extra,
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        return {"loss_type": loss_type, "seed": seed, "error": done.stderr[-2000:]}
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result.update(loss_type=loss_type, seed=seed, run_wall_s=round(time.time() - started, 1))
    with (out / "runs.jsonl").open("a") as f:
        f.write(json.dumps(result) + "\n")
    print(
        f"[grpo_loss_types] {loss_type} seed {seed}: {result['correct_before']} -> {result['correct_after']} "
        f"of {result['settings']['n_eval']} in {result['run_wall_s']}s",
        file=sys.stderr,
        flush=True,
    )
    return result


def summarize(runs: list[dict], types: list[str]) -> dict:
    ok = [r for r in runs if "error" not in r]
    per_type = {}
    for t in types:
        mine = [r for r in ok if r["loss_type"] == t]
        after = [r["correct_after"] for r in mine]
        gain = [r["correct_after"] - r["correct_before"] for r in mine]
        per_type[t] = {
            "runs": len(mine),
            "correct_after_median": median(after) if after else None,
            "correct_after_range": [min(after), max(after)] if after else None,
            "gain_median": median(gain) if gain else None,
            "gain_range": [min(gain), max(gain)] if gain else None,
            "sign_test_p": [r["sign_test_p"] for r in mine],
            "train_wall_s_median": median(r["train_wall_s"] for r in mine) if mine else None,
        }
    paired = {}
    for a, b in itertools.combinations(types, 2):
        flags_a, flags_b = [], []
        for seed in sorted({r["seed"] for r in ok}):
            ra = next((r for r in ok if r["loss_type"] == a and r["seed"] == seed), None)
            rb = next((r for r in ok if r["loss_type"] == b and r["seed"] == seed), None)
            if ra and rb:
                flags_a += ra["after_flags"]
                flags_b += rb["after_flags"]
        paired[f"{a} vs {b}"] = {"prompts": len(flags_a), **mcnemar(flags_a, flags_b)}  # gained: b right, a wrong
    return {"per_type": per_type, "paired_mcnemar": paired}


def main() -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--types", default="grpo,dr_grpo,dapo")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--parallel", type=int, default=2)
    p.add_argument("--out", help="output directory (default: a temporary one)")
    p.add_argument("extra", nargs=argparse.REMAINDER, help="after --: arguments for grpo_learning.py")
    a = p.parse_args()
    types, seeds = a.types.split(","), [int(x) for x in a.seeds.split(",")]
    out = Path(a.out or tempfile.mkdtemp(prefix="grpo_loss_types_"))
    out.mkdir(parents=True, exist_ok=True)
    extra = [x for x in a.extra if x != "--"]
    started = time.time()
    order = [(t, s) for s in seeds for t in types]  # interleaved: each seed's types side by side in time
    with ThreadPoolExecutor(a.parallel) as pool:
        runs = list(pool.map(lambda ts: run(ts[0], ts[1], out, extra), order))
    result = {
        "types": types,
        "seeds": seeds,
        "extra": extra,
        **summarize(runs, types),
        "errors": [r for r in runs if "error" in r],
        "wall_s": round(time.time() - started, 1),
        "out": str(out),
    }
    print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()
