"""The training craft people tune (issue 62), each measured on the demo's two SFT stages at equal steps.

On the support pipeline's SFT (dragon_dagster/defs/support: 187 tickets, 13 held out by subject) and the orders
pipeline's tool-use SFT (dragon_dagster/defs/orders: every assistant turn trained, 30 conversations held out), each
variant of the sft stage's settings trains a fresh adapter on SmolLM2-135M-Instruct through the engine (the
stage's own settings from its defs.yaml and quick profile, then the variant's, then --steps and the seed):

    lora        the pipeline's `lora:` as it is (r 16, alpha 32): the baseline
    dora        lora: {use_dora: true}                       (PEFT's DoRA)
    rslora_r64  lora: {use_rslora: true, r: 64}              (rank-stabilized scaling, alpha / sqrt(r))
    lora_r64    lora: {r: 64}                                (the same rank without it: rsLoRA's fair comparison)
    pissa       lora: {init: pissa}                          (PiSSA's SVD initialisation)
    neftune     neftune_noise_alpha: 5                       (TRL's NEFTune, SFT only)
    early_stop  args: {eval_every: E, early_stopping: {patience: P}, keep: best}, max_steps --es-steps
    to_max      the same --es-steps run to max_steps with no early stopping (early_stop's comparison)
    merge       the support and orders `lora` adapters of each seed combined (TIES and DARE-TIES, weights 1, 1,
                density --density), against each adapter alone, scored on both tasks

Figures per run, on held-out rows only: the stage's held-out loss (reply NLL, every held-out row), its task score
(support: exact and token_f1 of greedy replies to the held-out tickets, as the sft stage and the report compute
them; orders: call_correct and answer_exact of engine/evaluate/tool_use.py, the orders report's figures, with the
tool run), and its step time (the trainer's train_runtime / steps). Seeds are interleaved (for seed: for variant),
each run in its own interpreter (torch's threads and TRL's seeding are process-wide), one at a time. A variant whose
settings the stage does not accept yet (a field not built) is reported as refused, with the reason, and the rest go
on. The merge runs through the `merge_adapters` stage kind (--merge-via stage, the default) or, as a fallback
labelled in the output, through PEFT's `add_weighted_adapter` directly (--merge-via peft).

    .venv/bin/python benchmarks/craft.py                                   # every variant, 3 seeds
    .venv/bin/python benchmarks/craft.py --variants lora,dora --seeds 1 --steps 4 --tasks support

Log lines go to stderr; stdout carries the markdown tables for RESULTS.md, then one JSON line (the summary).
Every run's record is appended to <out>/runs.jsonl as it ends.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PIPELINES = {
    "support": ROOT / "dragon_dagster" / "defs" / "support" / "defs.yaml",
    "orders": ROOT / "dragon_dagster" / "defs" / "orders" / "defs.yaml",
}
DATASET = {"support": ("tickets", "sft_dataset"), "orders": ("traces", "trace_dataset")}
SFT_STAGE = "sft_adapter"

# What each variant changes in the sft stage's settings (the interface issue 62 fixes; es_* filled from the flags).
VARIANTS = {
    "lora": {},
    "dora": {"lora": {"use_dora": True}},
    "rslora_r64": {"lora": {"use_rslora": True, "r": 64}},
    "lora_r64": {"lora": {"r": 64}},
    "pissa": {"lora": {"init": "pissa"}},
    "neftune": {"neftune_noise_alpha": 5},
    "early_stop": "early stopping",  # built by variant_overrides from --es-steps, --eval-every, --patience
    "to_max": "to max_steps",
}
MERGE = "merge"
COMBINATIONS = ("ties", "dare_ties")
DEFAULT_VARIANTS = [*VARIANTS, MERGE]


def log(message: str) -> None:
    print(f"[craft {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        out[key] = deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", default=",".join(DEFAULT_VARIANTS), help=f"comma-separated: {DEFAULT_VARIANTS}")
    p.add_argument("--tasks", default="support,orders", help="comma-separated: support, orders")
    p.add_argument("--seeds", type=int, default=3, help="training seeds 1..N, interleaved")
    p.add_argument("--steps", type=int, default=8, help="SFT steps of --batch-size rows, equal on both tasks")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--lr", type=float, default=5e-4, help="the quick profiles' SFT learning rate (both pipelines)")
    p.add_argument("--es-steps", type=int, help="early_stop's and to_max's max_steps (default: 3 x --steps)")
    p.add_argument("--eval-every", type=int, help="early_stop's eval_every in steps (default: --steps / 2)")
    p.add_argument("--patience", type=int, default=2, help="early_stop's early_stopping.patience (evaluations)")
    p.add_argument("--eval-rows", type=int, default=12, help="held-out rows whose replies are scored (task score)")
    p.add_argument(
        "--max-eval-rows",
        type=int,
        help="args.max_eval_rows of every run (issue 62: the stage scores a seeded sample of its held-out split); "
        "default: the stage's own (every held-out row), as the pipelines run",
    )
    p.add_argument("--max-new-tokens", type=int, default=48, help="reply budget of the task score")
    p.add_argument("--density", type=float, default=0.5, help="the merges' density (TIES / DARE keep this share)")
    p.add_argument("--merge-via", choices=("stage", "peft"), default="stage", help="see the module's docstring")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads of each run")
    p.add_argument("--out", help="output directory (default: a temporary one)")
    a = p.parse_args(argv)
    a.variants = [v.strip() for v in a.variants.split(",") if v.strip()]
    unknown = [v for v in a.variants if v not in DEFAULT_VARIANTS]
    if unknown:
        p.error(f"unknown variants {unknown}; choose from {DEFAULT_VARIANTS}")
    a.tasks = [t.strip() for t in a.tasks.split(",") if t.strip()]
    if set(a.tasks) - set(PIPELINES):
        p.error(f"unknown tasks {sorted(set(a.tasks) - set(PIPELINES))}; choose from {sorted(PIPELINES)}")
    a.es_steps = a.es_steps or 3 * a.steps
    a.eval_every = a.eval_every or max(1, a.steps // 2)
    return a


# --- the stage's settings for one run ---------------------------------------------------------------------------


def variant_overrides(variant: str, a) -> dict:
    if variant == "early_stop":
        early = {"eval_every": a.eval_every, "early_stopping": {"patience": a.patience}, "keep": "best"}
        return {"args": {"max_steps": a.es_steps, **early}}
    if variant == "to_max":
        return {"args": {"max_steps": a.es_steps}}
    return VARIANTS[variant]


def stage_settings(task: str, variant: str, seed: int, a) -> dict:
    """The pipeline's sft stage (defs.yaml, then its quick profile), equal steps and batch, then the variant."""
    from dragon_dagster.engine.pipeline import load

    pipeline = load(PIPELINES[task])
    stage = next(s for s in pipeline.stages if s.name == SFT_STAGE).model_dump(mode="json", exclude_unset=True)
    stage = deep_merge(stage, (pipeline.profiles or {}).get("quick", {}).get(SFT_STAGE, {}))
    run = {
        "max_steps": a.steps,
        "batch_size": a.batch_size,
        "grad_accum": 1,
        "learning_rate": a.lr,
        "warmup_ratio": 0.0,
        "logging_steps": 1,
        "save_steps": 10_000,
        "seed": seed,
        **({"max_eval_rows": a.max_eval_rows} if a.max_eval_rows else {}),
    }
    # the task score is computed here on --eval-rows rows; the stage itself answers them too only for support,
    # whose stage metrics are the score (orders' first reply is a call: tool_use.py scores it below)
    stage = deep_merge(stage, {"args": run, "n_samples": a.eval_rows if task == "support" else 0})
    stage["max_new_tokens"] = a.max_new_tokens
    return deep_merge(stage, variant_overrides(variant, a))


def refusal(settings: dict) -> str | None:
    """Why the sft kind refuses these settings (a field not built yet, a bad value), or None."""
    from pydantic import ValidationError

    from dragon_dagster.engine import catalog

    try:
        catalog.parse_stage(settings)
    except ValidationError as e:
        return "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
    except Exception as e:  # noqa: BLE001 - any refusal is the variant's outcome, reported
        return f"{type(e).__name__}: {e}"
    return None


# --- the datasets, once ---------------------------------------------------------------------------------------


def build_datasets(tasks: list[str], out: Path) -> dict[str, str]:
    """Each task's chat dataset artifact (train.jsonl, eval.jsonl), made by its pipeline through Dagster."""
    from dagster import DagsterInstance

    from dragon_dagster.assets.launch import materialize_pipeline
    from dragon_dagster.engine.pipeline import load
    from dragon_dagster.resources import ArtifactStore, MLflowTracking, TrainingResource

    made = {}
    for task in tasks:
        runs = out / "data" / task
        resources = {
            "store": ArtifactStore(runs_dir=str(runs)),
            "tracking": MLflowTracking(runs_dir=str(runs)),
            "training": TrainingResource(device="cpu"),
        }
        outcome = materialize_pipeline(
            load(PIPELINES[task]), "quick", resources, DagsterInstance.ephemeral(), only=list(DATASET[task])
        )
        if not outcome["success"]:
            raise SystemExit(f"{task}: its dataset stages failed; their log is above")
        made[task] = outcome["artifacts"][DATASET[task][1]]
        log(f"{task} data: {made[task]}")
    return made


# --- one run, in its own interpreter --------------------------------------------------------------------------


class StderrReporter:
    stop_requested = False

    def log(self, message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    def step(self, progress) -> None:
        pass

    def metrics(self, step: int, values: dict) -> None:
        pass

    def should_stop(self) -> bool:
        return False


def tool_cases(data: str, limit: int) -> tuple[list[dict], object]:
    from dragon_dagster.engine.data.tables import read_jsonl
    from dragon_dagster.engine.evaluate import tool_use
    from dragon_dagster.engine.pipeline import load
    from dragon_dagster.engine.tools.declare import Toolset, with_tools

    toolset = Toolset.from_settings(load(PIPELINES["orders"]).tools)
    rows = read_jsonl(Path(data) / "eval.jsonl")
    with_tools(rows, toolset.schemas)
    return tool_use.tool_cases(rows)[:limit], toolset


def task_score(task: str, model, data: str, a, loss: bool = True) -> dict:
    """The task's figures of a loaded model on its first --eval-rows held-out rows: what each pipeline's evaluation
    reports (loss False: the orders replies alone, where the stage has measured the held-out loss already)."""
    from dragon_dagster.engine import models
    from dragon_dagster.engine.data.tables import read_jsonl
    from dragon_dagster.engine.evaluate import tool_use
    from dragon_dagster.engine.evaluate.replies import evaluate_rows
    from dragon_dagster.engine.text.matchers import exact
    from dragon_dagster.engine.tools import template
    from dragon_dagster.engine.tools.declare import with_tools

    base = str(models.embedded_model_dir())
    tokenizer = models.load_tokenizer(base)
    if task == "support":
        rows = read_jsonl(Path(data) / "eval.jsonl")[: a.eval_rows]
        figures = evaluate_rows(model, tokenizer, rows, a.eval_rows, a.max_new_tokens, max_len=256)
        return {"eval_loss": figures["eval_loss"], **{k: figures["metrics"].get(k) for k in ("exact", "token_f1")}}
    template.prepare(tokenizer, needed=True)
    cases, toolset = tool_cases(data, a.eval_rows)
    rows = read_jsonl(Path(data) / "eval.jsonl")[: a.eval_rows]
    with_tools(rows, toolset.schemas)
    held_out_loss = evaluate_rows(model, tokenizer, rows, 0, 1, max_len=768)["eval_loss"] if loss else None
    measured = tool_use.measure(model, tokenizer, cases, toolset, a.max_new_tokens)
    answers = [exact(s["answer"], c["answer"]) for s, c in zip(measured["samples"], cases)]
    return {
        "eval_loss": held_out_loss,
        "call_correct": measured["figures"]["call_correct"],
        "answer_exact": sum(answers) / max(1, len(answers)),
    }


def train_one(task: str, variant: str, seed: int, data: str, a, out: Path) -> dict:
    """One sft stage through the engine, then its task score with the saved adapter folded into the base."""
    import torch

    torch.set_num_threads(a.threads)
    from dragon_dagster.engine import catalog, models
    from dragon_dagster.engine.config.hardware import Hardware
    from dragon_dagster.engine.config.job import TrainingInputs
    from dragon_dagster.engine.pipeline import load

    run_dir = out / "runs" / f"{task}-{variant}-seed{seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    settings = catalog.parse_stage(stage_settings(task, variant, seed, a))
    pipeline = load(PIPELINES[task])
    inputs = TrainingInputs(
        model=str(models.embedded_model_dir()),
        train_file=str(Path(data) / "train.jsonl"),
        eval_file=str(Path(data) / "eval.jsonl"),
        checkpoint_dir=str(run_dir / "checkpoints"),
        tools=pipeline.tools.to_input(run_dir / "tools") if pipeline.tools else None,
    )
    kind = catalog.get(settings.kind)
    job = kind.job_model()(settings=settings, inputs=inputs, output_dir=str(run_dir), hardware=Hardware(device="cpu"))
    started = time.time()
    kind.load_worker()(job, StderrReporter())
    wall = time.time() - started
    result = json.loads((run_dir / "metrics.json").read_text())
    steps = result.get("global_step") or 0
    runtime = result.get("train_runtime_s")
    record = {
        "task": task,
        "variant": variant,
        "seed": seed,
        "steps": steps,
        "max_steps": settings.args.max_steps,
        "step_s": runtime / steps if runtime and steps else None,
        "train_wall_s": round(wall, 1),
        # which step the adapter holds and why (the result's `kept`, with held-out evaluation while training)
        "kept": result.get("kept"),
        "adapter": str(run_dir / "adapter"),
    }
    if task == "support":  # the stage's own figures are the task's: held-out loss and its replies' metrics
        record.update(
            {"eval_loss": result.get("eval_loss"), **{k: result["metrics"].get(k) for k in ("exact", "token_f1")}}
        )
    else:
        model = models.load_model(
            str(models.embedded_model_dir()), Hardware(device="cpu"), adapters=[record["adapter"]]
        )
        record.update(task_score(task, model.eval(), data, a, loss=False))
        record["eval_loss"] = result.get("eval_loss")
    return record


def merge_one(seed: int, adapters: dict[str, str], data: dict[str, str], a, out: Path) -> list[dict]:
    """Each adapter alone and their TIES / DARE-TIES merges, every one scored on both tasks."""
    import torch

    torch.set_num_threads(a.threads)
    from peft import PeftModel

    from dragon_dagster.engine import models
    from dragon_dagster.engine.config.hardware import Hardware

    torch.manual_seed(seed)  # DARE drops at random
    base = str(models.embedded_model_dir())
    records = []
    models_to_score = [(f"{task} adapter alone", "alone", [adapters[task]]) for task in adapters]
    models_to_score += [(f"{c} merge", c, None) for c in COMBINATIONS]
    for label, how, chain in models_to_score:
        started = time.time()
        if chain is not None:
            model = models.load_model(base, Hardware(device="cpu"), adapters=chain)
            via = "-"
        elif a.merge_via == "stage":
            run_dir = out / "runs" / f"merge-{how}-seed{seed}"
            model, via = merged_by_stage(how, adapters, seed, run_dir, a), "the merge_adapters stage"
        else:
            model = PeftModel.from_pretrained(
                models.load_model(base, Hardware(device="cpu")), adapters["support"], adapter_name="support"
            )
            model.load_adapter(adapters["orders"], adapter_name="orders")
            model.add_weighted_adapter(
                ["support", "orders"], [1.0, 1.0], adapter_name="merged", combination_type=how, density=a.density
            )
            model.set_adapter("merged")
            model = model.merge_and_unload()
            via = "PEFT add_weighted_adapter directly (fallback)"
        model.eval()
        record = {"merge": label, "seed": seed, "via": via, "density": a.density if chain is None else None}
        for task in data:
            record[task] = task_score(task, model, data[task], a)
        record["wall_s"] = round(time.time() - started, 1)
        records.append(record)
        log(f"seed {seed} {label}: {record}")
        del model
    return records


def merged_by_stage(combination: str, adapters: dict[str, str], seed: int, run_dir: Path, a):
    """The merge_adapters stage kind (issue 62) on the two adapters, through the engine; its adapter folded in."""
    from dragon_dagster.engine import catalog, models
    from dragon_dagster.engine.config.hardware import Hardware

    order = ("support", "orders")
    settings = catalog.parse_stage(
        {
            "name": "merged_adapters",
            "kind": "merge_adapters",
            "adapters": [{"artifact": str(Path(adapters[t]).parent)} for t in order],
            "weights": [1.0, 1.0],
            "combination": combination,
            "density": a.density,
            "seed": seed,
        }
    )
    kind = catalog.get(settings.kind)
    job_model = kind.job_model()
    inputs_model = job_model.model_fields["inputs"].annotation
    base = str(models.embedded_model_dir())
    # the engine's inputs as the Dagster step would resolve them from the adapters' manifests (these runs have none)
    given = {"model": base, "before": [], "adapters": [adapters[t] for t in order], "labels": list(order)}
    inputs = inputs_model(**{k: v for k, v in given.items() if k in inputs_model.model_fields})
    run_dir.mkdir(parents=True, exist_ok=True)
    job = job_model(settings=settings, inputs=inputs, output_dir=str(run_dir), hardware=Hardware(device="cpu"))
    kind.load_worker()(job, StderrReporter())
    return models.load_model(base, Hardware(device="cpu"), adapters=[str(run_dir / "adapter")])


def isolated(what: list[str], a, out: Path) -> dict | list:
    """One run in its own interpreter, its log in <out>/logs; its record, or {"failed": the reason}."""
    settings = out / "args.json"
    settings.write_text(json.dumps(vars(a)))
    (out / "logs").mkdir(exist_ok=True)
    log_file = out / "logs" / ("-".join(what[:4] if what[0] == "train" else what[:2]) + ".log")
    with log_file.open("w") as err:
        done = subprocess.run(
            [sys.executable, __file__, "--one", str(settings), str(out), *what],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    if done.returncode != 0:
        lines = [line for line in log_file.read_text().strip().splitlines() if line.strip()]
        return {"failed": (lines[-1][:400] if lines else f"exit {done.returncode}") + f" (log: {log_file})"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def one(settings: str, out: str, what: str, *rest: str) -> None:
    a = argparse.Namespace(**json.loads(Path(settings).read_text()))
    if what == "train":
        task, variant, seed, data = rest
        record = train_one(task, variant, int(seed), data, a, Path(out))
    else:
        seed, adapters, data = rest
        record = merge_one(int(seed), json.loads(adapters), json.loads(data), a, Path(out))
    print(json.dumps(record), flush=True)


# --- the tables -----------------------------------------------------------------------------------------------


def spread(values: list) -> str:
    values = [v for v in values if isinstance(v, (int, float))]
    if not values:
        return "-"
    low, mid, high = min(values), median(values), max(values)
    return f"{mid:.3f}" if low == high else f"{mid:.3f} [{low:.3f}, {high:.3f}]"


SCORES = {"support": ("exact", "token_f1"), "orders": ("call_correct", "answer_exact")}
LABELS = {
    "lora": "LoRA r 16 (baseline)",
    "dora": "DoRA (`use_dora: true`)",
    "rslora_r64": "rsLoRA r 64 (`use_rslora: true, r: 64`)",
    "lora_r64": "LoRA r 64",
    "pissa": "PiSSA init (`init: pissa`)",
    "neftune": "NEFTune (`neftune_noise_alpha: 5`)",
}


def variant_table(records: list[dict], task: str, variants: list[str], failed: dict) -> str:
    s1, s2 = SCORES[task]
    lines = [f"| {task}: variant | held-out loss | {s1} | {s2} | step s | seeds |", "|---|---|---|---|---|---|"]
    for variant in variants:
        mine = [r for r in records if r["task"] == task and r["variant"] == variant]
        label = LABELS.get(variant, variant)
        if not mine:
            lines.append(f"| {label} | failed: {failed.get((task, variant), 'not run')} | | | | 0 |")
            continue
        cells = [spread([r.get(k) for r in mine]) for k in ("eval_loss", s1, s2, "step_s")]
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {len(mine)} |")
    return "\n".join(lines)


def stopping_table(records: list[dict], task: str, a, failed: dict) -> str:
    s1, s2 = SCORES[task]
    lines = [
        f"| {task}: run | steps run (of {a.es_steps}) | held-out loss | {s1} | {s2} | what the stage reports | seeds |",
        "|---|---|---|---|---|---|---|",
    ]
    names = {
        "early_stop": f"`eval_every: {a.eval_every}, early_stopping: {{patience: {a.patience}}}, keep: best`",
        "to_max": f"to `max_steps: {a.es_steps}`",
    }
    for variant, label in names.items():
        mine = [r for r in records if r["task"] == task and r["variant"] == variant]
        if not mine:
            lines.append(f"| {label} | failed: {failed.get((task, variant), 'not run')} | | | | | 0 |")
            continue
        cells = [spread([r.get(k) for r in mine]) for k in ("steps", "eval_loss", s1, s2)]
        told = "; ".join(kept_sentence(r["kept"]) for r in mine if r.get("kept")) or "-"
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {told} | {len(mine)} |")
    return "\n".join(lines)


def kept_sentence(kept: dict) -> str:
    """What a seed's stage said it kept: 'stopped 14/24, kept 8' or 'ran 24/24, kept 24'."""
    ran = "stopped" if kept.get("stopped_early") else "ran"
    return f"{ran} {kept.get('last_step')}/{kept.get('planned_steps')}, kept {kept.get('step')}"


def merge_table(records: list[dict], failed: list[str]) -> str:
    lines = [
        "| model | via | support loss | support token_f1 | orders loss | orders call_correct | orders answer_exact "
        "| seeds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label in dict.fromkeys(r["merge"] for r in records):
        mine = [r for r in records if r["merge"] == label]
        cells = [
            spread([r["support"].get("eval_loss") for r in mine]),
            spread([r["support"].get("token_f1") for r in mine]),
            spread([r["orders"].get("eval_loss") for r in mine]),
            spread([r["orders"].get("call_correct") for r in mine]),
            spread([r["orders"].get("answer_exact") for r in mine]),
        ]
        lines.append(f"| {label} | {mine[0]['via']} | " + " | ".join(cells) + f" | {len(mine)} |")
    lines += [f"| failed | {reason} | | | | | | |" for reason in failed]
    return "\n".join(lines)


# --- the run --------------------------------------------------------------------------------------------------


def schedule(a) -> list[tuple[str, int, str | None, str | None]]:
    """The runs in order, seeds outermost (for seed: for variant: for task), so a drift of the machine's speed
    over the run falls on every variant alike: ("train", seed, variant, task), and each seed's ("merge", seed, ...)
    after its lora runs on both tasks (the merge's inputs, trained even when --variants or --tasks leave them out)."""
    merging = MERGE in a.variants
    trained = [v for v in a.variants if v != MERGE]
    if merging and "lora" not in trained:
        trained.insert(0, "lora")
    plan = []
    for seed in range(1, a.seeds + 1):
        for variant in trained:
            tasks = list(PIPELINES) if variant == "lora" and merging else a.tasks
            plan += [("train", seed, variant, task) for task in tasks]
        if merging:
            plan.append(("merge", seed, None, None))
    return plan


def main(argv=None) -> dict:
    a = parse_args(argv)
    out = Path(a.out or tempfile.mkdtemp(prefix="craft_")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    plan = schedule(a)
    data = build_datasets(sorted({step[3] for step in plan if step[0] == "train"}, key=list(PIPELINES).index), out)
    records, failed, merges, merge_failed = [], {}, [], []
    for what, seed, variant, task in plan:
        if what == "merge":
            adapters = {r["task"]: r["adapter"] for r in records if r["variant"] == "lora" and r["seed"] == seed}
            if len(adapters) < 2:
                merge_failed.append(f"seed {seed}: no lora adapter of {sorted({'support', 'orders'} - set(adapters))}")
                continue
            done = isolated(["merge", str(seed), json.dumps(adapters), json.dumps(data)], a, out)
            if isinstance(done, dict):
                merge_failed.append(f"seed {seed}: {done['failed']}")
                log(f"merge seed {seed}: failed ({done['failed']})")
                continue
            merges += done
            with (out / "runs.jsonl").open("a") as f:
                f.writelines(json.dumps(r) + "\n" for r in done)
            continue
        refused = refusal(stage_settings(task, variant, seed, a))
        if refused:
            failed[(task, variant)] = f"refused: {refused}"
            log(f"{task} {variant} seed {seed}: refused ({refused})")
            continue
        record = isolated(["train", task, variant, str(seed), data[task]], a, out)
        if "failed" in record:
            failed[(task, variant)] = record["failed"]
            log(f"{task} {variant} seed {seed}: failed ({record['failed']})")
            continue
        records.append(record)
        with (out / "runs.jsonl").open("a") as f:
            f.write(json.dumps(record) + "\n")
        log(
            f"{task} {variant} seed {seed}: loss {record.get('eval_loss')}, "
            + ", ".join(f"{k} {record.get(k)}" for k in SCORES[task])
            + f", {record['steps']} steps, {record['step_s'] or 0:.2f} s a step, {record['train_wall_s']} s"
        )
    wall = round(time.time() - started, 1)
    sections = [
        f"SmolLM2-135M-Instruct, {a.steps} SFT steps of {a.batch_size} rows at lr {a.lr} on both tasks, seeds "
        f"1-{a.seeds} interleaved; medians [min, max]; task scores on {a.eval_rows} held-out rows, greedy, "
        f"{a.max_new_tokens} new tokens; whole run {wall / 60:.1f} min."
    ]
    trained = list(dict.fromkeys(step[2] for step in plan if step[0] == "train"))
    plain = [v for v in trained if v in LABELS]
    for task in a.tasks:
        if plain:
            sections.append(variant_table(records, task, plain, failed))
        if {"early_stop", "to_max"} & set(trained):
            sections.append(stopping_table(records, task, a, failed))
    if MERGE in a.variants:
        sections.append(
            f"Merges of each seed's support and orders `lora` adapters (weights 1, 1, density {a.density}), "
            f"scored on both tasks (losses and scores on the same first {a.eval_rows} held-out rows of each):\n\n"
            + merge_table(merges, merge_failed)
        )
    print("\n\n".join(sections), flush=True)
    summary = {
        "settings": vars(a),
        "runs": records,
        "failed": {f"{t}/{v}": why for (t, v), why in failed.items()},
        "merges": merges,
        "merge_failed": merge_failed,
        "wall_s": wall,
        "out": str(out),
    }
    print(json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        one(*sys.argv[2:])
    else:
        main()
