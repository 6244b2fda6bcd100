"""RLHF against the main objectives over seeds: feedback_learning.py's results, one per seed, read together.

Each result is one `feedback_learning.py --variants <main>,rlhf --seed S` run (its own held-out split, chat and
retrainings). This prints, per seed and as the median with its range, the liked share of the start, the main
retraining and the RLHF variant, the reward model's held-out pairs, and the exact McNemar test of the two
retrainings on each seed's paired held-out tickets and pooled over the seeds (the pairs stay within a seed).

    .venv/bin/python benchmarks/feedback_seeds.py benchmarks/records/2026-12-06-feedback-rlhf-seeds/seed*/result.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from feedback_learning import mcnemar  # noqa: E402


def seed_row(result: dict) -> dict:
    """One seed's figures: liked counts, the paired test between the retrainings, the reward model's held-out pairs."""
    main = result["rounds"][0]
    variant = next(v for v in result["variants"] if "rlhf" in v["objectives"])
    stages = variant.get("stages") or {}
    return {
        "seed": result["settings"]["seed"],
        "n": result["start"]["n"],
        "start": result["start"]["liked"],
        "main": main["after"]["liked"],
        "rlhf": variant["after"]["liked"],
        "main_flags": main["liked_flags"],
        "rlhf_flags": variant["liked_flags"],
        "vs_main": mcnemar(main["liked_flags"], variant["liked_flags"]),
        "reward_model": stages.get("feedback_reward_model"),
        "rlhf_stage": stages.get("rlhf_on_feedback"),
        "records": main["chat"]["records"],
    }


def summary(results: list[dict]) -> dict:
    rows = [seed_row(r) for r in results]
    main_flags = [f for row in rows for f in row["main_flags"]]
    rlhf_flags = [f for row in rows for f in row["rlhf_flags"]]

    def spread(key: str) -> dict:
        values = [row[key] for row in rows]
        return {"median": statistics.median(values), "min": min(values), "max": max(values)}

    return {
        "seeds": [row["seed"] for row in rows],
        "per_seed": [{k: v for k, v in row.items() if not k.endswith("_flags")} for row in rows],
        "start": spread("start"),
        "main": spread("main"),
        "rlhf": spread("rlhf"),
        "pooled_vs_main": mcnemar(main_flags, rlhf_flags),
    }


def markdown(s: dict) -> str:
    lines = [
        "| seed | records | reward model: held-out pairs right (trained on) | RLHF's KL | start liked | main liked "
        "| with rlhf liked | rlhf vs main (gained / lost, p) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in s["per_seed"]:
        t, rm, rl = row["vs_main"], row["reward_model"] or {}, row["rlhf_stage"] or {}
        right = round((rm.get("accuracy") or 0) * (rm.get("eval_pairs") or 0))
        lines.append(
            f"| {row['seed']} | {row['records']} | {right}/{rm.get('eval_pairs')} ({rm.get('train_pairs')}) | "
            f"{rl.get('kl') or 0:.3f} | {row['start']}/{row['n']} | {row['main']}/{row['n']} | "
            f"{row['rlhf']}/{row['n']} | {t['gained']} / {t['lost']}, p = {t['p']} |"
        )
    m = {k: s[k] for k in ("start", "main", "rlhf")}
    p = s["pooled_vs_main"]
    lines.append(
        "| **median (range)** | | | | "
        + " | ".join(f"{v['median']:g} ({v['min']}-{v['max']})" for v in m.values())
        + f" | pooled {p['gained']} / {p['lost']}, p = {p['p']} |"
    )
    return "\n".join(lines)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", nargs="+", help="feedback_learning.py result.json files, one per seed")
    a = p.parse_args(argv)
    s = summary([json.loads(Path(f).read_text()) for f in a.results])
    print(markdown(s), file=sys.stderr)
    print(json.dumps(s))
    return s


if __name__ == "__main__":
    main()
