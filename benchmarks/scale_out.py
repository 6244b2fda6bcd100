"""Scale-out costs, measured in one run on this machine:

- launcher overhead: the same one-stage SFT materialization through the `subprocess` launcher and through the
  `ray` launcher (a Ray head this script starts on 127.0.0.1 and stops), best of --repeats each; the difference
  is what a Ray job adds (submission, runtime env, the job's log as the Pipes channel). Goal: under 5 s.
- data parallelism: the same SFT stage (same global batch) with workers 1 and 2, through torchrun (subprocess
  launcher) and Ray Train (ray launcher): wall time of the materialization and trained tokens/s of the trainer.

    .venv/bin/python benchmarks/scale_out.py --repeats 3 --steps 8
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from compare_trl import sft_pipeline_yaml  # the peer benchmark's rows: same data as the other figures

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.conftest import RayHead  # noqa: E402 - the tests' loopback head: own ports, stopped process by process


def pipeline_yaml(work: Path, model: Path, steps: int, batch: int) -> Path:
    return sft_pipeline_yaml(work, model, n_rows=128, steps=steps, batch=batch, more_args=", save_steps: 1000")


def materialize_stage(
    parts, instance, runs: Path, training, *assets: str, args: dict | None = None
) -> tuple[float, dict]:
    from dagster import AssetSelection, materialize

    from dragon_dagster.resources import ArtifactStore, MLflowTracking

    resources = {
        "store": ArtifactStore(runs_dir=str(runs)),
        "tracking": MLflowTracking(runs_dir=str(runs)),
        "training": training,
    }
    start = time.perf_counter()
    run_config = {"ops": {"bench__sft_adapter": {"config": {"args": args}}}} if args else None
    result = materialize(
        parts["assets"],
        instance=instance,
        resources=resources,
        run_config=run_config,
        selection=AssetSelection.assets(*[["bench", a] for a in assets]),
    )
    wall = time.perf_counter() - start
    assert result.success
    artifact = Path(
        result.get_asset_materialization_events()[-1].event_specific_data.materialization.metadata["artifact_dir"].value
    )
    result = json.loads((artifact / "manifest.json").read_text()).get("result", {})
    progress = artifact / "progress.jsonl"  # a trainer's: num_tokens counted over all ranks
    steps = [json.loads(line) for line in progress.read_text().splitlines()] if progress.exists() else []
    result["num_tokens"] = max((r.get("num_tokens") or 0 for r in steps), default=0)
    return wall, result


def tokens_per_s(result: dict) -> float | None:
    tokens, seconds = result.get("num_tokens"), result.get("train_runtime_s")
    return tokens / seconds if tokens and seconds else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--batch", type=int, default=8, help="global batch (rows per optimizer step)")
    p.add_argument("--model", default="", help="model dir; empty: a tiny random model from the embedded tokenizer")
    p.add_argument("--parts", default="launchers,metrics,workers")
    p.add_argument("--json", default="")
    a = p.parse_args()

    from dagster import DagsterInstance

    from dragon_dagster.assets.factory import build_pipeline_defs
    from dragon_dagster.engine import models
    from dragon_dagster.engine.pipeline import load
    from dragon_dagster.resources import TrainingResource

    work = Path(tempfile.mkdtemp(prefix="scale-out-"))
    model = (
        Path(a.model)
        if a.model
        else models.build_tiny_model(work / "tiny", tokenizer_from=str(models.embedded_model_dir()))
    )
    parts = build_pipeline_defs(load(pipeline_yaml(work, model, a.steps, a.batch)))
    instance = DagsterInstance.ephemeral()
    runs = work / "runs"
    materialize_stage(parts, instance, runs, TrainingResource(device="cpu"), "rows", "sft_dataset")
    head = RayHead(work, cpus=max(4, os.cpu_count() or 2))
    measured: dict = {"machine": f"{os.cpu_count()} cores", "steps": a.steps, "global_batch": a.batch}
    try:
        variants = {
            "subprocess": TrainingResource(device="cpu"),
            # the job holds every core, as the child process uses them (cpus_per_worker: 1 by default)
            "ray": TrainingResource(
                device="cpu", launcher="ray", ray_address=head.address, cpus_per_worker=os.cpu_count() or 1
            ),
        }
        materialize_stage(parts, instance, runs, variants["ray"], "sft_adapter")  # warm: the head's first job
        if "launchers" in a.parts:
            measure_launchers(a, parts, instance, runs, variants, measured)
        if "metrics" in a.parts:
            measure_metrics(a, parts, instance, runs, variants, measured)
        if "workers" in a.parts:
            measure_workers(parts, instance, runs, head, measured)
    finally:
        head.stop()
    print(table(measured))
    if a.json:
        Path(a.json).write_text(json.dumps(measured, indent=2))


def measure_launchers(a, parts, instance, runs: Path, variants: dict, measured: dict) -> None:
    for name, training in variants.items():
        walls = [materialize_stage(parts, instance, runs, training, "sft_adapter")[0] for _ in range(a.repeats)]
        measured[f"{name}_s"] = min(walls)
        print(f"{name}: best of {a.repeats} {min(walls):.2f} s ({', '.join(f'{w:.1f}' for w in walls)})", flush=True)
    measured["ray_overhead_s"] = measured["ray_s"] - measured["subprocess_s"]


def measure_metrics(a, parts, instance, runs: Path, variants: dict, measured: dict) -> None:
    """Every step's metrics as a Pipes message, logged to MLflow by the step, against one message in all."""
    for name, training in variants.items():
        for every in (1, a.steps):
            walls = [
                materialize_stage(parts, instance, runs, training, "sft_adapter", args={"logging_steps": every})[0]
                for _ in range(a.repeats)
            ]
            measured[f"{name}_log_every_{every}_s"] = min(walls)
        per_step = (measured[f"{name}_log_every_1_s"] - measured[f"{name}_log_every_{a.steps}_s"]) / (a.steps - 1)
        measured[f"{name}_metrics_per_step_s"] = per_step
        print(f"{name}: metrics of every step cost {per_step * 1000:+.0f} ms a step", flush=True)


def measure_workers(parts, instance, runs: Path, head, measured: dict) -> None:
    from dragon_dagster.resources import TrainingResource

    for launcher in ("subprocess", "ray"):
        for workers in (1, 2):
            extra = {"launcher": "ray", "ray_address": head.address} if launcher == "ray" else {}
            training = TrainingResource(device="cpu", workers=workers, **extra)
            wall, result = materialize_stage(parts, instance, runs, training, "sft_adapter")
            measured[f"{launcher}_workers{workers}"] = {
                "wall_s": wall,
                "tokens_per_s": tokens_per_s(result),
                "train_loss": result.get("train_loss"),
            }
            print(f"{launcher} workers={workers}: {wall:.1f} s, {tokens_per_s(result) or 0:.0f} tokens/s", flush=True)


def table(m: dict) -> str:
    lines = []
    if "ray_s" in m:
        lines += [
            "| launcher | one-stage SFT materialization, best of runs | overhead against subprocess |",
            "|---|---|---|",
            f"| subprocess | {m['subprocess_s']:.2f} s | - |",
            f"| ray | {m['ray_s']:.2f} s | {m['ray_overhead_s']:+.2f} s |",
            "",
        ]
    if "ray_metrics_per_step_s" in m:
        lines += [
            "| launcher | metrics of every step (Pipes message, then MLflow in the step), cost a step |",
            "|---|---|",
            f"| subprocess (temp file channel) | {m['subprocess_metrics_per_step_s'] * 1000:+.0f} ms |",
            f"| ray (the job's log as the channel) | {m['ray_metrics_per_step_s'] * 1000:+.0f} ms |",
            "",
        ]
    if "ray_workers2" in m:
        lines += ["| data parallel | 1 worker | 2 workers | 2 against 1 |", "|---|---|---|---|"]
        for launcher, how in (("subprocess", "torchrun"), ("ray", "Ray Train")):
            one, two = m[f"{launcher}_workers1"], m[f"{launcher}_workers2"]
            lines.append(
                f"| {how}: materialization wall time | {one['wall_s']:.1f} s | {two['wall_s']:.1f} s | "
                f"{one['wall_s'] / two['wall_s']:.2f}x speed-up |"
            )
            if one["tokens_per_s"] and two["tokens_per_s"]:
                lines.append(
                    f"| {how}: trained tokens/s | {one['tokens_per_s']:.0f} | {two['tokens_per_s']:.0f} | "
                    f"{two['tokens_per_s'] / one['tokens_per_s']:.2f}x |"
                )
            lines.append(
                f"| {how}: final train loss | {one['train_loss']:.6f} | {two['train_loss']:.6f} | same global batch |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
