"""Data at scale (issue 63): what the stages cost as a support-tickets dataset grows from 1,000 to 100,000 rows
(and the dataset stage alone at 1,000,000).

The data is what a new user would bring: a CSV of support tickets in groups of three paraphrases of one case (the
same customer, product, symptom and serial number, written three ways, answered with one reply), generated here
deterministically from --seed, `group_by` on the case id so a case's paraphrases stay on one side of the split.
The pipeline (written into the output directory, run through Dagster as `dg launch` would) is the support demo's
first two stages on it:

    sft_dataset   chat_dataset: "{subject}\\n\\n{body}" -> reply, group_by case_id, eval_frac --eval-frac
    sft_adapter   sft: --steps steps of 4 rows on --model, then its held-out evaluation (args.max_eval_rows: a
                  seeded sample of the held-out split, default 200; --max-eval-rows all scores every row, as
                  before issue 62, which is the issue's symptom: minutes of evaluation after seconds of training)

Parts (--parts; each run in its own interpreter, one at a time, sizes interleaved within each repeat):

    dataset   the source snapshot and the dataset stage (Dagster's step times), the process's peak memory (its
              max RSS: the Dagster process, which maps the table itself), the rows each side, and any timing the
              dataset manifest records (near-duplicate clustering, the personal-data scan: every `seconds` /
              `*_seconds` / `timings` entry, shown as a column when present)
    sft       the SFT stage on that dataset (Dagster's step time), the worker's peak memory (the trainer's
              process: RUSAGE_CHILDREN of the Dagster process, the warm worker off so the worker is its child),
              training's own runtime, and the held-out rows it scored ("200 of 10000 ...")

    contamination
              the contamination check (find_contamination, 13-grams) of that dataset's train split against the
              general-skills suite and --contamination-eval-rows held-out rows: its time, the memory it adds, the
              rows it found contaminated

A part is a function of (size, args, output dir) in PARTS. The feedback store is measured by feedback_scale.py (its
sizes are records, on SQLite and PostgreSQL). --dataset-only-sizes runs the dataset part alone at those sizes (the
1M row).

    .venv/bin/python benchmarks/data_scale.py                                     # 1k, 10k, 100k; 1M dataset only
    .venv/bin/python benchmarks/data_scale.py --sizes 1000 --dataset-only-sizes "" --steps 1

Goal (issue 63): every figure grows at most linearly with the rows; the dataset stage at 100k <= 60 s, <= 2 GB;
the SFT stage at 100k about as long as at 1k. Log lines go to stderr; stdout carries the markdown table, then one
JSON line (the summary). Every run's record is appended to <out>/runs.jsonl as it ends.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import random
import resource
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PIPELINE = "tickets"
DATASET_STAGE = "sft_dataset"
SFT_STAGE = "sft_adapter"


def log(message: str) -> None:
    print(f"[data_scale {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- the data ---------------------------------------------------------------------------------------------------

PRODUCTS = {
    "Hub Pro": [("blinks red", "unplug it for ten seconds and check the Ethernet cable")],
    "Doorbell Cam": [
        ("video lags by several seconds", "lower the stream quality to 720p in the camera settings"),
        ("chime stays silent", "re-pair the chime in Settings > Devices"),
    ],
    "Smart Plug": [("drops off the Wi-Fi", "move it within ten metres of the router and reset it")],
    "Thermostat": [
        ("shows the wrong temperature", "recalibrate the sensor in Settings > Climate"),
        ("ignores the schedule", "turn off vacation mode and save the schedule again"),
    ],
    "Light Strip": [("flickers at low brightness", "update the firmware from the app's device page")],
    "Door Lock": [("battery drains in a week", "disable auto-lock polling and replace the batteries")],
}
NAMES = ["Priya", "Alex", "Sam", "Maria", "Tomasz", "Aiko", "Lena", "Omar", "Jules", "Ines", "Kofi", "Mei"]
SURNAMES = ["Novak", "Okafor", "Silva", "Berg", "Tanaka", "Moreau", "Khan", "Weber", "Rossi", "Park", "Lund", "Diaz"]
SINCE = ["for a week now", "since the last app update", "since yesterday", "after a power cut", "every evening"]
ROOMS = ["kitchen", "hallway", "garage", "bedroom", "office", "porch", "attic", "living room", "basement", "nursery"]
ROUTERS = ["Fritz!Box", "Netgear", "TP-Link", "Eero", "Asus", "Linksys", "mesh", "provider's"]
# what makes two customers' tickets about the same fault differ, as real ones do: where the device is, how old it is,
# the app and the network (without it, cases differing only by a serial number are near-copies of each other)
DETAIL = "It is the one in the {room}, bought {months} months ago, app {version}, on a {router} router."
# three ways to say one case: the paraphrases a near-duplicate check should find and group_by keeps together
PARAPHRASES = [
    "Hi team, my {product} {issue} {since}. Serial {serial}. {detail} What should I do?\n{name}",
    "Hello support, the {product} (serial {serial}) {issue}, {since}. {detail} Can you help?\nThanks, {name}",
    "{product} {serial}: it {issue} {since}. {detail} Any idea how to fix this?\n{name}",
]
REPLY = (
    "Hi {name}, sorry about the trouble with your {product} (serial {serial}). Please {fix}. If that does not "
    "help, reply here with case {case} and we will arrange a replacement."
)
COLUMNS = ["case_id", "subject", "body", "product", "reply"]


def ticket_rows(n: int, seed: int = 0):
    """n rows of tickets, three paraphrases per case (the last case cut short when n is not a multiple of 3),
    the same rows for the same n and seed, each case's serial its own so cases differ."""
    rng = random.Random(seed)
    catalogue = [(p, issue, fix) for p, issues in PRODUCTS.items() for issue, fix in issues]
    case = 0
    while True:
        product, issue, fix = rng.choice(catalogue)
        values = {
            "product": product,
            "issue": issue,
            "fix": fix,
            "since": rng.choice(SINCE),
            "name": f"{rng.choice(NAMES)} {rng.choice(SURNAMES)}",
            "detail": DETAIL.format(
                room=rng.choice(ROOMS),
                months=rng.randrange(1, 37),
                version=f"{rng.randrange(3, 6)}.{rng.randrange(20)}.{rng.randrange(10)}",
                router=rng.choice(ROUTERS),
            ),
            "serial": f"{rng.randrange(16**8):08X}",
            "case": f"C{case:07d}",
        }
        reply = REPLY.format(**values)
        for template in PARAPHRASES:
            if n <= 0:
                return
            yield {
                "case_id": values["case"],
                "subject": f"{product} {issue}",
                "body": template.format(**values),
                "product": product,
                "reply": reply,
            }
            n -= 1
        case += 1


def write_tickets(path: Path, n: int, seed: int = 0) -> Path:
    """The CSV of n rows (kept and reused when it is there: the rows are a function of n and seed)."""
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    with partial.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(ticket_rows(n, seed))
    partial.rename(path)
    return path


def pipeline_yaml(csv_path: Path, a) -> str:
    """The pipeline component's defs.yaml: the tickets, the dataset stage and the SFT stage."""
    eval_rows = "null" if a.max_eval_rows is None else a.max_eval_rows
    return textwrap.dedent(f"""\
        type: dragon_dagster.PostTrainingPipeline
        attributes:
          name: {PIPELINE}
          model: {a.model}
          datasets:
            tickets: {{path: "{csv_path}"}}
          stages:
            - {{name: {DATASET_STAGE}, kind: chat_dataset, source: tickets, prompt: "{{subject}}\\n\\n{{body}}",
                response: reply, system: "You are a concise, warm support agent.", eval_frac: {a.eval_frac},
                seed: 42, group_by: case_id}}
            - name: {SFT_STAGE}
              kind: sft
              dataset: {DATASET_STAGE}
              lora: {{r: 16, alpha: 32, dropout: 0.05, target_modules: auto}}
              args: {{max_steps: {a.steps}, batch_size: 4, grad_accum: 1, max_seq_len: 256, learning_rate: 5.0e-4,
                     logging_steps: 1, save_steps: 10000, max_eval_rows: {eval_rows}}}
              n_samples: {a.n_samples}
              max_new_tokens: 48
        """)


# --- one run, in its own interpreter ----------------------------------------------------------------------------


def size_dir(out: Path, size: int) -> Path:
    return out / f"rows-{size}"


def prepared(size: int, a, out: Path) -> tuple[Path, Path]:
    """The size's CSV and pipeline (defs.yaml), and its Dagster home (the dataset part's run is the SFT part's
    input: the SFT run loads the dataset's artifact from the same instance)."""
    where = size_dir(out, size)
    csv_path = write_tickets(Path(a.data_dir or out / "data") / f"tickets-{size}-seed{a.seed}.csv", size, a.seed)
    defs = where / "defs" / PIPELINE / "defs.yaml"
    defs.parent.mkdir(parents=True, exist_ok=True)
    defs.write_text(pipeline_yaml(csv_path, a))
    (where / "dagster_home").mkdir(exist_ok=True)
    return defs, where


def materialize(size: int, a, out: Path, only: list[str]) -> dict:
    from dagster import DagsterInstance

    from dragon_dagster.assets.launch import materialize_pipeline
    from dragon_dagster.engine.pipeline import load
    from dragon_dagster.resources import ArtifactStore, MLflowTracking, TrainingResource

    defs, where = prepared(size, a, out)
    runs = where / "runs"
    resources = {
        "store": ArtifactStore(runs_dir=str(runs)),
        "tracking": MLflowTracking(runs_dir=str(runs)),
        # a fresh worker, the child of this process, so RUSAGE_CHILDREN is the trainer's peak memory
        "training": TrainingResource(device="cpu", warm_start=False),
    }
    instance = DagsterInstance.local_temp(str(where / "dagster_home"))
    outcome = materialize_pipeline(load(defs), resources=resources, instance=instance, only=only)
    stages = {s["asset"].split("/")[-1]: s for s in outcome["stages"]}
    failed = [name for name in only if stages[name]["status"] != "SUCCESS"]
    if failed:
        raise SystemExit(f"{size} rows: {failed} failed (the Dagster log is above)")
    # a blocking check that fails (the leak check, say) fails the run, not the stage: it is a finding, recorded
    stages["checks_failed"] = [c["name"] for c in outcome.get("checks", []) if not c["passed"]]
    return stages


def peak_mb(who: int) -> float:
    """Max RSS in MB of this process (RUSAGE_SELF) or of its largest waited-for child (RUSAGE_CHILDREN);
    Linux reports kilobytes."""
    return round(resource.getrusage(who).ru_maxrss / 1024, 1)


def manifest_timings(manifest: dict, prefix: str = "", depth: int = 0) -> dict[str, float]:
    """Every timing a dataset manifest records, by its dotted path: a `timings` or `seconds` entry (a number or a
    dict of them), or a number under a key ending in `_seconds` (near-duplicate clustering, the personal-data
    scan, ... as other parts add them)."""
    found = {}
    for key, value in manifest.items():
        name = f"{prefix}{key}"
        timing_key = key in ("timings", "seconds") or key.endswith("_seconds")
        if isinstance(value, bool):
            continue
        if isinstance(value, (int, float)) and timing_key:
            found[name] = float(value)
        elif isinstance(value, dict) and depth < 3:
            inner = manifest_timings(value, f"{name}.", depth + 1)
            if key in ("timings", "seconds"):  # every number inside is a timing
                inner.update(
                    {
                        f"{name}.{k}": float(v)
                        for k, v in value.items()
                        if isinstance(v, (int, float)) and not isinstance(v, bool)
                    }
                )
            found.update(inner)
    return found


def dataset_part(size: int, a, out: Path) -> dict:
    stages = materialize(size, a, out, ["tickets", DATASET_STAGE])
    artifact = Path(stages[DATASET_STAGE]["artifact"])
    manifest = json.loads((artifact / "manifest.json").read_text())
    return {
        "source_s": round(stages["tickets"]["seconds"], 2),
        "stage_s": round(stages[DATASET_STAGE]["seconds"], 2),
        "peak_mb": peak_mb(resource.RUSAGE_SELF),
        "train_rows": manifest.get("train_rows"),
        "eval_rows": manifest.get("eval_rows"),
        "timings": manifest_timings(manifest),
        "checks_failed": stages["checks_failed"],
    }


def sft_part(size: int, a, out: Path) -> dict:
    stages = materialize(size, a, out, [SFT_STAGE])
    artifact = Path(stages[SFT_STAGE]["artifact"])
    result = json.loads((artifact / "metrics.json").read_text())
    held = result.get("held_out_rows") or {}
    return {
        "stage_s": round(stages[SFT_STAGE]["seconds"], 2),
        "peak_mb": peak_mb(resource.RUSAGE_CHILDREN),  # the worker: the trainer and its evaluation
        "dagster_peak_mb": peak_mb(resource.RUSAGE_SELF),
        "train_runtime_s": result.get("train_runtime_s"),
        "steps": result.get("global_step"),
        "held_out_scored": held.get("scored"),
        "held_out_total": held.get("total"),
    }


def latest_artifact(size: int, out: Path, stage: str) -> Path:
    """The stage's newest artifact of this size's runs (the dataset part's)."""
    found = sorted((size_dir(out, size) / "runs").glob(f"**/artifacts/{PIPELINE}/{stage}/*/manifest.json"))
    if not found:
        raise SystemExit(f"{size} rows: no {stage} artifact under {size_dir(out, size) / 'runs'}: run its dataset part")
    return found[-1].parent


def contamination_part(size: int, a, out: Path) -> dict:
    """The contamination check's own work (find_contamination, as a report's blocking check calls it) on this
    size's train split against the evaluation sets a report scores on: the bundled general-skills suite and a
    second stage's held-out split of the same source (this dataset's eval.jsonl, its first --contamination-eval-rows,
    checked against the train split as a stage drawing from it differently would be; group_by keeps the tickets'
    paraphrases apart, so what it finds is the shared reply template, the check's share rule at work)."""
    from dragon_dagster.engine.evaluate.contamination import find_contamination, read_rows, skill_items
    from dragon_dagster.engine.evaluate.general_skills import SUITE_TAG

    artifact = latest_artifact(size, out, DATASET_STAGE)
    held = list(itertools.islice(read_rows(artifact / "eval.jsonl"), a.contamination_eval_rows))
    evaluation, _ = skill_items([SUITE_TAG])
    evaluation["other_stage_held_out"] = held
    before = peak_mb(resource.RUSAGE_SELF)
    found = find_contamination({DATASET_STAGE: read_rows(artifact / "train.jsonl")}, evaluation)
    return {
        "stage_s": round(found.seconds, 2),
        "peak_mb": peak_mb(resource.RUSAGE_SELF),
        "added_mb": round(peak_mb(resource.RUSAGE_SELF) - before, 1),
        "training_rows": found.training_rows,
        "eval_rows": sum(len(rows) for rows in evaluation.values()),
        "contaminated": sum(found.contaminated.values()),
    }


# a part: (size, args, output dir) -> its record; what it needs first (a part of the same size, run before it)
PARTS = {
    "dataset": (dataset_part, None),
    "sft": (sft_part, "dataset"),
    "contamination": (contamination_part, "dataset"),
}


def isolated(part: str, size: int, a, out: Path) -> dict:
    """One part at one size in its own interpreter, its log in <out>/logs; its record, or {"failed": why}."""
    settings = out / "args.json"
    settings.write_text(json.dumps(vars(a)))
    (out / "logs").mkdir(exist_ok=True)
    log_file = out / "logs" / f"{part}-{size}.log"
    started = time.time()
    with log_file.open("w") as err:
        done = subprocess.run(
            [sys.executable, __file__, "--one", str(settings), str(out), part, str(size)],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    record = {"part": part, "rows": size, "wall_s": round(time.time() - started, 1)}
    if done.returncode != 0:
        lines = [line for line in log_file.read_text().strip().splitlines() if line.strip()]
        return {**record, "failed": (lines[-1][:400] if lines else f"exit {done.returncode}") + f" (log: {log_file})"}
    return {**record, **json.loads(done.stdout.strip().splitlines()[-1])}


def one(settings: str, out: str, part: str, size: str) -> None:
    a = argparse.Namespace(**json.loads(Path(settings).read_text()))
    import torch

    torch.set_num_threads(a.threads)
    print(json.dumps(PARTS[part][0](int(size), a, Path(out))), flush=True)


# --- the plan and the table -------------------------------------------------------------------------------------


def sizes(text: str) -> list[int]:
    return [int(float(s)) for s in text.split(",") if s.strip()]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="1000,10000,100000", help="rows of the CSV, comma-separated")
    p.add_argument("--dataset-only-sizes", default="1000000", help="sizes run with the dataset part alone")
    p.add_argument("--parts", default="dataset,sft,contamination", help=f"comma-separated, of {list(PARTS)}")
    p.add_argument("--repeats", type=int, default=1, help="runs of each part and size, interleaved")
    p.add_argument("--model", default="smollm2-135m", help="the SFT stage's model (a preset or a directory)")
    p.add_argument("--steps", type=int, default=3, help="SFT steps of 4 rows")
    p.add_argument("--eval-frac", type=float, default=0.1, help="the dataset stage's held-out share")
    p.add_argument(
        "--max-eval-rows",
        default="200",
        help="the SFT stage's args.max_eval_rows; 'all' scores every held-out row (before issue 62: the symptom)",
    )
    p.add_argument(
        "--contamination-eval-rows", type=int, default=1000, help="held-out rows the contamination part checks"
    )
    p.add_argument("--n-samples", type=int, default=3, help="held-out rows the SFT stage answers (task metrics)")
    p.add_argument("--seed", type=int, default=0, help="the CSV generator's seed")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads of each run")
    p.add_argument("--data-dir", help="where the CSVs are written and reused (default: <out>/data)")
    p.add_argument("--out", help="output directory (default: a temporary one)")
    a = p.parse_args(argv)
    a.sizes = sizes(a.sizes)
    a.dataset_only_sizes = sizes(a.dataset_only_sizes)
    a.parts = [s.strip() for s in a.parts.split(",") if s.strip()]
    unknown = [part for part in a.parts if part not in PARTS]
    if unknown:
        p.error(f"unknown parts {unknown}; choose from {list(PARTS)}")
    a.max_eval_rows = None if a.max_eval_rows.lower() in ("all", "null", "none") else int(a.max_eval_rows)
    return a


def schedule(a) -> list[tuple[str, int]]:
    """(part, size) in run order: repeats outermost, then sizes, then the parts (a part after the one it needs);
    the dataset-only sizes after each repeat's others."""
    plan = []
    for _ in range(a.repeats):
        for size in a.sizes:
            wanted = list(a.parts)
            for part in a.parts:
                needs = PARTS[part][1]
                if needs and needs not in wanted:
                    wanted.insert(wanted.index(part), needs)
            plan += [(part, size) for part in wanted]
        plan += [("dataset", size) for size in a.dataset_only_sizes if size not in a.sizes]
    return plan


def fig(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def table(records: list[dict]) -> str:
    """One line per size: each part's figures (median over repeats), timings from the manifest as columns."""
    from statistics import median

    done = [r for r in records if "failed" not in r]
    timing_names = sorted({k for r in done if r["part"] == "dataset" for k in r.get("timings", {})})
    head = ["rows", "dataset s (source s)", "dataset peak MB", "train / eval rows"]
    head += [f"{name} s" for name in timing_names]
    head += ["SFT stage s", "SFT training s", "SFT peak MB", "held-out rows scored"]
    head += ["contamination s (+MB)", "contaminated / checked"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def mid(part: str, size: int, key: str, inner: str | None = None):
        values = [r[key] if inner is None else r.get(key, {}).get(inner) for r in done if r["part"] == part]
        values = [v for r, v in zip([r for r in done if r["part"] == part], values) if r["rows"] == size]
        values = [v for v in values if isinstance(v, (int, float))]
        return median(values) if values else None

    for size in sorted({r["rows"] for r in records}):
        data = [r for r in done if r["part"] == "dataset" and r["rows"] == size]
        sft = [r for r in done if r["part"] == "sft" and r["rows"] == size]
        dirty = [r for r in done if r["part"] == "contamination" and r["rows"] == size]
        cells = [
            f"{size:,}",
            f"{fig(mid('dataset', size, 'stage_s'))} ({fig(mid('dataset', size, 'source_s'))})",
            fig(mid("dataset", size, "peak_mb"), 0),
            f"{data[0]['train_rows']:,} / {data[0]['eval_rows']:,}" if data else "-",
        ]
        cells += [fig(mid("dataset", size, "timings", name), 2) for name in timing_names]
        cells += [
            fig(mid("sft", size, "stage_s")),
            fig(mid("sft", size, "train_runtime_s")),
            fig(mid("sft", size, "peak_mb"), 0),
            f"{sft[0]['held_out_scored']} of {sft[0]['held_out_total']}" if sft else "-",
            f"{fig(mid('contamination', size, 'stage_s'))} (+{fig(mid('contamination', size, 'added_mb'), 0)})",
            f"{dirty[0]['contaminated']} / {dirty[0]['eval_rows']:,}" if dirty else "-",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    failed = [f"| {r['rows']:,} | {r['part']} failed: {r['failed']} |" for r in records if "failed" in r]
    checks = [
        f"| {r['rows']:,} | {r['part']}: checks that failed: {', '.join(r['checks_failed'])} |"
        for r in done
        if r.get("checks_failed")
    ]
    return "\n".join(lines + failed + checks)


def main(argv=None) -> dict:
    a = parse_args(argv)
    out = Path(a.out or tempfile.mkdtemp(prefix="data_scale_")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    records = []
    for part, size in schedule(a):
        if part != "dataset":
            needs = PARTS[part][1]
            if needs and any(r["part"] == needs and r["rows"] == size and "failed" in r for r in records):
                records.append({"part": part, "rows": size, "failed": f"its {needs} part failed"})
                continue
        log(f"{part} at {size:,} rows ...")
        record = isolated(part, size, a, out)
        records.append(record)
        with (out / "runs.jsonl").open("a") as f:
            f.write(json.dumps(record) + "\n")
        log(f"{part} at {size:,} rows: {record}")
    wall = round(time.time() - started, 1)
    eval_rows = "every held-out row" if a.max_eval_rows is None else f"args.max_eval_rows {a.max_eval_rows}"
    print(
        f"Tickets in groups of three paraphrases, group_by case_id, eval_frac {a.eval_frac}; SFT: {a.model}, "
        f"{a.steps} steps of 4 rows, {eval_rows}, {a.n_samples} replies; {a.threads} torch threads; "
        f"medians of {a.repeats} run(s); whole run {wall / 60:.1f} min.\n\n" + table(records),
        flush=True,
    )
    summary = {"settings": vars(a), "runs": records, "wall_s": wall, "out": str(out)}
    print(json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        one(*sys.argv[2:])
    else:
        main()
