"""benchmarks/craft.py: each variant trains the pipeline's own sft stage at equal steps, seeds interleaved, and a
variant the stage refuses is reported with its reason while the rest go on. No training here: what the script
builds and prints, from the real pipelines and the sft kind's real settings model."""

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def craft():
    spec = importlib.util.spec_from_file_location("craft_benchmark", ROOT / "benchmarks" / "craft.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_seeds_are_outermost_and_each_seed_merges_after_its_lora_runs_on_both_tasks():
    c = craft()
    a = c.parse_args(["--variants", "dora,merge", "--tasks", "support", "--seeds", "2"])
    assert c.schedule(a) == [
        ("train", 1, "lora", "support"), ("train", 1, "lora", "orders"),  # the merge's inputs, though not asked
        ("train", 1, "dora", "support"), ("merge", 1, None, None),
        ("train", 2, "lora", "support"), ("train", 2, "lora", "orders"),
        ("train", 2, "dora", "support"), ("merge", 2, None, None),
    ]  # fmt: skip


def test_each_task_keeps_its_pipeline_stage_and_trains_the_same_steps_batch_rate_and_seed():
    c = craft()
    a = c.parse_args(["--steps", "6", "--seeds", "1"])
    support = c.stage_settings("support", "rslora_r64", 3, a)
    orders = c.stage_settings("orders", "rslora_r64", 3, a)
    for settings in (support, orders):
        assert {k: settings["args"][k] for k in ("max_steps", "batch_size", "grad_accum", "learning_rate", "seed")} == {
            "max_steps": 6,
            "batch_size": 4,
            "grad_accum": 1,
            "learning_rate": 5e-4,
            "seed": 3,
        }
        # the variant on top of the pipeline's lora block: its alpha and dropout kept
        assert settings["lora"] == {"r": 64, "alpha": 32, "dropout": 0.05, "target_modules": "auto", "use_rslora": True}
    assert orders["train_on"] == "all_assistant_turns" and orders["args"]["max_seq_len"] == 768
    assert support["args"]["max_seq_len"] == 256  # the support quick profile's
    stop = c.stage_settings("support", "early_stop", 1, a)["args"]
    assert stop["max_steps"] == 18 and stop["eval_every"] == 3 and stop["keep"] == "best"
    assert c.stage_settings("support", "to_max", 1, a)["args"]["max_steps"] == 18


def test_the_baseline_is_accepted_and_an_unknown_setting_is_refused_by_name():
    c = craft()
    a = c.parse_args(["--seeds", "1"])
    assert c.refusal(c.stage_settings("orders", "lora", 1, a)) is None
    settings = c.stage_settings("support", "lora", 1, a)
    settings["lora"]["use_magic"] = True
    assert "lora.use_magic" in c.refusal(settings)


def test_tables_give_medians_with_ranges_and_name_a_failed_variant():
    c = craft()
    runs = [
        {"task": "support", "variant": "lora", "eval_loss": loss, "exact": 0.0, "token_f1": f1, "step_s": s}
        for loss, f1, s in ((2.0, 0.3, 4.0), (2.2, 0.4, 5.0), (2.1, 0.35, 4.5))
    ]
    table = c.variant_table(runs, "support", ["lora", "dora"], {("support", "dora"): "refused: lora.use_dora: no"})
    assert (
        "| LoRA r 16 (baseline) | 2.100 [2.000, 2.200] | 0.000 | 0.350 [0.300, 0.400] | 4.500 [4.000, 5.000] | 3 |"
        in (table)
    )
    assert "| DoRA (`use_dora: true`) | failed: refused: lora.use_dora: no |" in table
