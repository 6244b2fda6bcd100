"""benchmarks/data_scale.py: the tickets it generates (deterministic, paraphrases of a case in threes), the plan it
runs, the timings it reads from a dataset manifest and the table it prints. No pipeline runs here."""

import csv
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def data_scale():
    spec = importlib.util.spec_from_file_location("data_scale_benchmark", ROOT / "benchmarks" / "data_scale.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_tickets_are_deterministic_paraphrases_in_threes_one_reply_per_case(tmp_path):
    d = data_scale()
    rows = list(d.ticket_rows(10, seed=3))
    assert rows == list(d.ticket_rows(10, seed=3)) and rows != list(d.ticket_rows(10, seed=4))
    assert len(rows) == 10 and [r["case_id"] for r in rows[:4]] == ["C0000000"] * 3 + ["C0000001"]
    case = rows[:3]
    assert len({r["body"] for r in case}) == 3 and len({r["reply"] for r in case}) == 1, "three ways, one reply"
    assert case[0]["reply"] != rows[3]["reply"], "each case its own"
    path = d.write_tickets(tmp_path / "t.csv", 10, seed=3)
    with path.open(newline="") as f:
        assert list(csv.DictReader(f)) == rows  # multi-line bodies survive the CSV
    assert "group_by: case_id" in d.pipeline_yaml(path, d.parse_args([]))


def test_arguments_and_the_plan_interleave_sizes_with_the_dataset_before_what_needs_it():
    d = data_scale()
    a = d.parse_args(["--sizes", "1000,1e4", "--dataset-only-sizes", "1e6", "--parts", "sft", "--repeats", "2"])
    assert a.sizes == [1000, 10000] and a.max_eval_rows == 200
    assert d.schedule(a) == [
        ("dataset", 1000), ("sft", 1000), ("dataset", 10000), ("sft", 10000), ("dataset", 1000000),
    ] * 2  # fmt: skip
    assert d.parse_args(["--max-eval-rows", "all"]).max_eval_rows is None
    assert "max_eval_rows: null" in d.pipeline_yaml(Path("x.csv"), d.parse_args(["--max-eval-rows", "all"]))
    try:
        d.parse_args(["--parts", "dataset,feedback_store"])
    except SystemExit:
        pass
    else:
        raise AssertionError("an unknown part is refused")


def test_timings_other_parts_record_in_the_manifest_become_columns():
    d = data_scale()
    manifest = {
        "train_rows": 900,
        "near_duplicates": {"clusters": 300, "seconds": 1.5},
        "pii": {"found": 2, "scan_seconds": 0.25},
        "timings": {"split": 0.1, "note": "x"},
        "quality": {"empty": True},
    }
    timings = d.manifest_timings(manifest)
    assert timings == {"near_duplicates.seconds": 1.5, "pii.scan_seconds": 0.25, "timings.split": 0.1}
    records = [
        {"part": "dataset", "rows": 1000, "source_s": 0.5, "stage_s": 10.0, "peak_mb": 600.0, "train_rows": 900,
         "eval_rows": 100, "timings": timings, "checks_failed": ["held_out_not_leaking"]},
        {"part": "sft", "rows": 1000, "stage_s": 60.0, "peak_mb": 1200.0, "train_runtime_s": 4.0,
         "held_out_scored": 100, "held_out_total": 100},
        {"part": "contamination", "rows": 1000, "stage_s": 2.5, "added_mb": 40.0, "training_rows": 900,
         "eval_rows": 1100, "contaminated": 3},
        {"part": "dataset", "rows": 10000, "failed": "boom"},
    ]  # fmt: skip
    table = d.table(records)
    assert "| rows | dataset s (source s) | dataset peak MB | train / eval rows | near_duplicates.seconds s |" in table
    assert (
        "| 1,000 | 10.0 (0.5) | 600 | 900 / 100 | 1.50 | 0.25 | 0.10 | 60.0 | 4.0 | 1200 | 100 of 100 | 2.5 (+40) "
        "| 3 / 1,100 |"
    ) in table
    assert "| 10,000 | dataset failed: boom |" in table
    assert "| 1,000 | dataset: checks that failed: held_out_not_leaking |" in table


def test_the_contamination_part_checks_the_dataset_s_train_split_and_finds_a_copied_row(tmp_path):
    """The part runs the check itself on the newest dataset artifact of its size: a held-out row that the train
    split holds word for word is found; the general-skills suite is checked beside it."""
    import json

    d = data_scale()
    artifact = tmp_path / "rows-5" / "runs" / "artifacts" / d.PIPELINE / d.DATASET_STAGE / "20261207-000000-a"
    artifact.mkdir(parents=True)
    (artifact / "manifest.json").write_text("{}")

    def row(i):
        text = f"ticket {i}: " + " ".join(f"word{i}x{j}" for j in range(20))
        return {"prompt": [{"role": "user", "content": text}], "completion": [{"role": "assistant", "content": "ok"}]}

    (artifact / "train.jsonl").write_text("".join(json.dumps(row(i)) + "\n" for i in range(5)))
    (artifact / "eval.jsonl").write_text("".join(json.dumps(row(i)) + "\n" for i in (3, 7)))  # 3 is in train
    a = d.parse_args(["--contamination-eval-rows", "2"])
    record = d.contamination_part(5, a, tmp_path)
    assert record["training_rows"] == 5 and record["contaminated"] == 1
    assert record["eval_rows"] > 2, "the skills suite's items are checked too"
