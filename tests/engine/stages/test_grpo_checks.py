"""The GRPO stage's asset checks on hand-written artifacts, evaluated by Dagster: reward hacking judged on the
training trend and on the held-out per-reward before/after (and blocking when the stage asks), completions cut
off at max_new_tokens; the asset page's per-reward metadata."""

import json
from pathlib import Path

from dagster import AssetCheckSeverity, AssetKey, DagsterInstance, MetadataValue, Output, asset, materialize

from dragon_dagster.assets.checks import asset_checks, build_checks
from dragon_dagster.assets.metadata import as_metadata
from dragon_dagster.engine.artifacts.manifest import AdapterManifest, write_manifest
from dragon_dagster.engine.stages.grpo.result import GRPOResult
from dragon_dagster.engine.stages.grpo.settings import GRPO
from dragon_dagster.engine.stages.sft.result import SFTResult
from dragon_dagster.engine.train.reinforce.checks import mean_clipped_ratio, reinforce_checks, suggest_max_new_tokens
from dragon_dagster.engine.train.reinforce.worker import progress_columns, truncation_warning

KEY = AssetKey(["p", "grpo_adapter"])
KINDS = {"numeric": "numeric", "length": "length"}


def grpo_result(max_new_tokens: int = 128, **fields) -> GRPOResult:
    """A GRPO stage's result with the run settings it always reports."""
    return GRPOResult(
        objective="grpo", group_size=4, beta=0.04, temperature=1.0, max_new_tokens=max_new_tokens, **fields
    )


def artifact(
    directory: Path, before: dict, after: dict, steps: list[dict], max_new_tokens: int = 128, **result
) -> Path:
    """A GRPO artifact as the worker leaves it: manifest result, progress rows, per-reward group records."""
    directory.mkdir(parents=True)
    write_manifest(
        directory,
        AdapterManifest[GRPOResult](
            stage="grpo_adapter",
            method="grpo",
            base_model="m",
            resolved_model="m",
            chain=[],
            dataset="prompts",
            settings={"max_new_tokens": max_new_tokens},
            result=grpo_result(
                max_new_tokens, reward_kinds=KINDS, per_reward_before=before, per_reward_after=after, **result
            ),
        ),
    )
    (directory / "progress.jsonl").write_text(
        "".join(json.dumps({"step": i + 1, "kl": 0.01, **row}) + "\n" for i, row in enumerate(steps))
    )
    (directory / "groups.jsonl").write_text(
        "".join(json.dumps({"reward": "numeric", "zero_std_frac": 0.5}) + "\n" for _ in steps)
    )
    return directory


def run(path: Path, block: bool = False):
    """Materialize a stub GRPO asset pointing at path, a stage after it, and the GRPO checks, in one run."""

    @asset(key=KEY)
    def grpo_adapter():
        return Output(str(path), metadata={"artifact_dir": MetadataValue.path(str(path))})

    @asset(key=AssetKey(["p", "merged_model"]), deps=[KEY])
    def merged_model():
        return "merged"

    stage = GRPO(
        name="grpo_adapter",
        kind="grpo",
        dataset="prompts",
        rewards=[{"type": "numeric"}, {"type": "length", "max_chars": 16}],
        kl_bound=1.0,
        zero_std_limit=0.9,
        truncation_limit=0.25,
        block_on_reward_hacking=block,
    )
    checks = asset_checks(KEY, reinforce_checks(stage))
    result = materialize(
        [grpo_adapter, merged_model, *checks], instance=DagsterInstance.ephemeral(), raise_on_error=False
    )
    evaluations = {e.check_name: e for e in result.get_asset_check_evaluations()}
    merged = [e.asset_key for e in result.get_asset_materialization_events()]
    return evaluations, AssetKey(["p", "merged_model"]) in merged


def flat_steps(n: int = 9, **row) -> list[dict]:
    return [dict(row) for _ in range(n)]


# The textbook case of issue 12: held-out numeric 0.154 -> 0.000 while length 0.055 -> 0.904; during training the
# numeric reward sat near 0 throughout, so the step-thirds comparison alone sees no accuracy falling.
HACKED = dict(
    before={"numeric": 0.154, "length": 0.055},
    after={"numeric": 0.0, "length": 0.904},
    steps=[
        {"reward_numeric": 0.0 if i % 4 else 0.05, "reward_length": 0.1 * i, "clipped_ratio": 0.0} for i in range(9)
    ],
)


def test_held_out_hacking_fails_the_check_though_the_training_trend_misses_it(tmp_path):
    evaluations, merged = run(artifact(tmp_path / "a", **HACKED))
    check = evaluations["format_not_rising_while_accuracy_falls"]
    meta = check.metadata
    assert not check.passed and check.severity == AssetCheckSeverity.WARN
    assert meta["accuracy_falling"].value == "-"  # the training trend alone would have passed it
    assert meta["held_out_accuracy_falling"].value == "numeric" and meta["held_out_format_rising"].value == "length"
    assert meta["reward_before/numeric"].value == 0.154 and meta["reward_after/length"].value == 0.904
    assert "0.154 -> 0.000" in check.description
    assert merged, "not blocking by default: the next stage still materializes"


def test_blocking_hacking_check_stops_the_next_stage(tmp_path):
    evaluations, merged = run(artifact(tmp_path / "a", **HACKED), block=True)
    check = evaluations["format_not_rising_while_accuracy_falls"]
    assert not check.passed and check.severity == AssetCheckSeverity.ERROR and check.blocking
    assert not merged, "a failed blocking check keeps the next stage from materializing in the same run"


def test_healthy_run_passes_every_check_and_a_blocking_check_lets_the_next_stage_run(tmp_path):
    steps = [
        {"reward_numeric": 0.2 + 0.05 * i, "reward_length": 0.3 + 0.02 * i, "clipped_ratio": 0.05} for i in range(9)
    ]
    path = artifact(
        tmp_path / "a", before={"numeric": 0.2, "length": 0.3}, after={"numeric": 0.5, "length": 0.5}, steps=steps
    )
    evaluations, merged = run(path, block=True)
    assert {n: e.passed for n, e in evaluations.items()} == {
        "format_not_rising_while_accuracy_falls": True,
        "kl_within_bound": True,
        "groups_have_reward_variance": True,
        "completions_not_truncated": True,
    }
    assert merged


def test_training_trend_alone_still_fails_the_check(tmp_path):
    steps = [{"reward_numeric": 0.6 - 0.06 * i, "reward_length": 0.1 * i} for i in range(9)]
    path = artifact(
        tmp_path / "a", before={"numeric": 0.3, "length": 0.3}, after={"numeric": 0.3, "length": 0.3}, steps=steps
    )
    evaluations, _ = run(path)
    check = evaluations["format_not_rising_while_accuracy_falls"]
    assert not check.passed and check.metadata["accuracy_falling"].value == "numeric"
    assert check.metadata["held_out_accuracy_falling"].value == "-"


def test_truncated_completions_fail_naming_max_new_tokens_and_a_value_to_try(tmp_path):
    path = artifact(
        tmp_path / "a",
        before={"numeric": 0.0, "length": 0.5},
        after={"numeric": 0.0, "length": 0.5},
        steps=flat_steps(reward_numeric=0.0, reward_length=0.5, clipped_ratio=0.8),
        max_new_tokens=12,
    )
    evaluations, merged = run(path, block=True)
    check = evaluations["completions_not_truncated"]
    assert not check.passed and check.severity == AssetCheckSeverity.WARN
    assert abs(check.metadata["mean_clipped_ratio"].value - 0.8) < 1e-9
    assert check.metadata["max_new_tokens"].value == 12 and check.metadata["suggested_max_new_tokens"].value == 32
    assert "max_new_tokens=12" in check.description and "try 32" in check.description
    assert merged, "truncation warns; it does not block"


def test_completions_that_fit_pass_and_unlogged_ratio_passes(tmp_path):
    fits = artifact(
        tmp_path / "a",
        before={"numeric": 0.2, "length": 0.5},
        after={"numeric": 0.3, "length": 0.5},
        steps=flat_steps(reward_numeric=0.3, reward_length=0.5, clipped_ratio=0.1),
    )
    assert run(fits)[0]["completions_not_truncated"].passed
    older = artifact(
        tmp_path / "b",
        before={"numeric": 0.2, "length": 0.5},
        after={"numeric": 0.3, "length": 0.5},
        steps=flat_steps(reward_numeric=0.3, reward_length=0.5),
    )
    check = run(older)[0]["completions_not_truncated"]
    assert check.passed and check.metadata["mean_clipped_ratio"].value == "not logged"


def test_worker_side_truncation_helpers():
    from dragon_dagster.engine.rewards import RewardSet

    columns = progress_columns(RewardSet.from_list([{"type": "numeric"}]))
    assert columns["completions/clipped_ratio"] == "clipped_ratio"  # TRL 1.x's key, recorded per step
    assert mean_clipped_ratio([{"clipped_ratio": 0.4}, {"clipped_ratio": 1.0}, {"loss": 1.0}]) == 0.7
    assert mean_clipped_ratio([{"loss": 1.0}]) is None
    assert suggest_max_new_tokens(12) == 32 and suggest_max_new_tokens(12, longest_reference=20) == 80
    summary = grpo_result(12, clipped_ratio=0.7, suggested_max_new_tokens=32)
    assert "max_new_tokens=12" in truncation_warning(summary, 0.25) and "try 32" in truncation_warning(summary, 0.25)
    assert truncation_warning(summary.model_copy(update={"clipped_ratio": 0.1}), 0.25) is None


def test_stage_settings_reach_the_checks(tmp_path):
    from dragon_dagster.engine.pipeline import Pipeline

    pipeline = Pipeline.model_validate(
        {
            "name": "p",
            "model": "m",
            "stages": [
                {"name": "prompts", "kind": "prompt_dataset", "path": "x.csv", "prompt": "q", "reference": "a"},
                {
                    "name": "grpo_adapter",
                    "kind": "grpo",
                    "dataset": "prompts",
                    "rewards": [{"type": "numeric"}],
                    "block_on_reward_hacking": True,
                    "truncation_limit": 0.5,
                },
            ],
        }
    )
    checks = {spec.name: spec for c in build_checks(pipeline) for spec in c.check_specs}
    assert checks["format_not_rising_while_accuracy_falls"].blocking
    assert not checks["completions_not_truncated"].blocking and "0.5" in checks["completions_not_truncated"].description


def test_asset_page_shows_per_reward_before_and_after():
    meta = as_metadata(
        grpo_result(
            12,
            per_reward_before={"numeric": 0.154, "length": 0.055},
            per_reward_after={"numeric": 0.0, "length": 0.904},
            clipped_ratio=0.4,
        ).metadata()
    )
    assert meta == {
        "reward_before/numeric": 0.154,
        "reward_before/length": 0.055,
        "reward_after/numeric": 0.0,
        "reward_after/length": 0.904,
        "clipped_ratio": 0.4,
        "max_new_tokens": 12,
    }
    other = as_metadata(SFTResult(objective="sft", train_loss=1.0, eval_loss=0.9).metadata())
    grpo_keys = {"clipped_ratio", "max_new_tokens"}
    assert not [k for k in other if k.startswith("reward_") or k in grpo_keys]  # other stages: nothing added


def test_the_demo_gives_grpo_the_budget_its_truncation_check_asks_for():
    """`make demo` (the bundled pipeline, quick profile) gives GRPO at least the max_new_tokens that
    completions_not_truncated suggests: at 12 tokens 40% of the demo's completions were cut off and the check asked
    for 32. Judged from the settings, the bundled prompts and the embedded model's tokenizer; nothing trains."""
    from dragon_dagster.assets.launch import find_pipeline
    from dragon_dagster.engine import models
    from dragon_dagster.engine.config.settings import overlay
    from dragon_dagster.engine.data.tables import read_table
    from dragon_dagster.engine.train.reinforce.worker import longest_reference_tokens

    pipeline = find_pipeline("support")
    stage = next(s for s in pipeline.stages if s.kind == "grpo")
    quick = type(stage).model_validate(overlay(stage.model_dump(), pipeline.profile("quick").get(stage.name, {})))
    prompts = next(s for s in pipeline.stages if s.name == stage.dataset)
    table = read_table(prompts.path)
    tokenizer = models.load_tokenizer(models.check_loadable(pipeline.model))
    longest = longest_reference_tokens(tokenizer, [{"reference": v} for v in table[prompts.reference]])
    assert longest and quick.max_new_tokens >= 4 * longest  # the check's room for the working before the answer
    assert quick.max_new_tokens >= suggest_max_new_tokens(12, longest) == 32  # what it asked for at 12 tokens
