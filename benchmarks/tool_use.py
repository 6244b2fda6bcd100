"""The orders pipeline's tool-use table for RESULTS.md, from its evaluation report.

    dragon demo --pipeline orders
    python benchmarks/tool_use.py runs/artifacts/orders/evaluation_report/<run>

The report (engine/evaluate/tool_use.py) replays every held-out conversation that calls a tool with the base and
the merged model: the first reply's call against the conversation's, then the whole conversation with the tool
run, its final answer against the reference answer; McNemar's exact test on the paired call_correct outcomes.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

FIGURES = ("tool_call_valid", "right_tool", "arguments_match", "call_correct", "answer_exact", "answer_token_f1")


def table(report: dict) -> str:
    base, merged = report["base"]["tools"], report["merged"]["tools"]
    paired = report["tool_use"]["paired"]
    n = base["conversations"]
    lines = [
        f"{n} held-out conversations that call a tool ({'held-out' if report['held_out'] else 'training'} rows), "
        "base model against merged, greedy:",
        "",
        "| figure | base | merged |",
        "|---|---|---|",
    ]
    for name in FIGURES:
        lines.append(f"| {name} | {base[name]:.3f} | {merged[name]:.3f} |")
    lines += [
        "",
        f"call_correct, paired (McNemar's exact test): {paired['only_merged']} conversations only the merged model "
        f"called right, {paired['only_base']} only the base; two-sided p = {paired['p_value']:.3g}.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("report_dir", type=Path, help="the evaluation_report artifact of the orders pipeline")
    args = parser.parse_args()
    print(table(json.loads((args.report_dir / "report.json").read_text())))


if __name__ == "__main__":
    main()
