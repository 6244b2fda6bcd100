"""Asset checks: the dataset is usable, the adapter learned, the merged model is not worse than the base."""

import json
import math
from pathlib import Path

from dagster import AssetCheckResult, AssetCheckSeverity, AssetKey, asset_check

from ..engine.data import tables as data_lib
from ..engine.rewards import ACCURACY_TYPES, FORMAT_TYPES
from ..engine.spec.pipeline import Pipeline
from ..engine.spec.registry import KINDS
from ..engine.train import progress
from ..resources import MLflowTracking
from .registry import promote_merged, report_merged_dir

MAX_DUPLICATE_SHARE = 0.2


def latest_path(context, key: AssetKey) -> Path:
    event = context.instance.get_latest_materialization_event(key)
    return Path(event.asset_materialization.metadata["artifact_dir"].value)


def dataset_check(key: AssetKey):
    @asset_check(
        asset=key,
        name="dataset_quality",
        blocking=True,
        description="Non-empty, no empty prompt or response (an ERROR that blocks the stages after it); "
        f"duplicates under {MAX_DUPLICATE_SHARE:.0%} (a warning).",
    )
    def _check(context) -> AssetCheckResult:
        path = latest_path(context, key)
        rows = data_lib.read_jsonl(path / "train.jsonl") + data_lib.read_jsonl(path / "eval.jsonl")
        quality = data_lib.quality(rows)
        broken = quality["rows"] == 0 or quality["empty_prompts"] > 0 or quality["empty_replies"] > 0
        ok = not broken and quality["duplicate_share"] <= MAX_DUPLICATE_SHARE
        return AssetCheckResult(
            passed=ok, metadata=quality, severity=AssetCheckSeverity.ERROR if broken else AssetCheckSeverity.WARN
        )

    return _check


# Held-out rows whose prompt or answer also appears word for word in train measure recall, not generalization.
# After exact duplicates are dropped any overlap is a leak, so the bound is 0.
MAX_OVERLAP = 0.0


def leakage_check(key: AssetKey, allow_leakage: bool, answers_count: bool):
    """Blocking: the held-out rows share no prompt (nor, for chat and pairs datasets, reply) with train. A prompt
    dataset's reference answers (a number, a label) repeat across different prompts by nature and are never
    trained on as text, so its answer overlap is reported but does not fail the check."""
    figures = "prompt_overlap" + (" or answer_overlap" if answers_count else "")

    @asset_check(
        asset=key,
        name="held_out_not_leaking",
        blocking=True,
        description=f"No held-out row's {figures.replace('_overlap', '')} also appears in train "
        f"(overlap above {MAX_OVERLAP}); "
        + ("allow_leakage: true makes it a warning." if allow_leakage else "blocks the stages after it."),
    )
    def _check(context) -> AssetCheckResult:
        manifest = json.loads((latest_path(context, key) / "manifest.json").read_text())
        prompt, answer = manifest.get("prompt_overlap", 0.0), manifest.get("answer_overlap", 0.0)
        leaking = prompt > MAX_OVERLAP or (answers_count and answer > MAX_OVERLAP)
        description = (
            f"{prompt:.0%} of the held-out rows have a prompt and {answer:.0%} an answer that also "
            "appear in train: held-out figures would measure recall. Set group_by to a column that "
            "keeps related rows together, or allow_leakage: true."
            if leaking
            else None
        )
        return AssetCheckResult(
            passed=not leaking,
            description=description,
            severity=AssetCheckSeverity.WARN if allow_leakage else AssetCheckSeverity.ERROR,
            metadata={
                "prompt_overlap": prompt,
                "answer_overlap": answer,
                "max_overlap": MAX_OVERLAP,
                "answer_overlap_counts": answers_count,
                "allow_leakage": allow_leakage,
                "duplicates_dropped": manifest.get("duplicates_dropped", 0),
            },
        )

    return _check


def adapter_check(key: AssetKey):
    @asset_check(
        asset=key,
        name="losses_finite_and_falling",
        description="Every logged training loss is finite and the last is below the first.",
    )
    def _check(context) -> AssetCheckResult:
        losses = [r["loss"] for r in progress.read(latest_path(context, key)) if r.get("loss") is not None]
        finite = all(math.isfinite(x) for x in losses)
        falling = len(losses) >= 2 and losses[-1] < losses[0]
        return AssetCheckResult(
            passed=bool(losses) and finite and falling,
            metadata={
                "logged_steps": len(losses),
                "all_finite": finite,
                "first_loss": losses[0] if losses else -1.0,
                "last_loss": losses[-1] if losses else -1.0,
            },
        )

    return _check


def report_check(key: AssetKey):
    @asset_check(
        asset=key,
        name="merged_not_worse_than_base",
        description="The merged model's held-out loss is not above the base model's (a warning). "
        "Passing makes the merged model the champion in the MLflow Model Registry, unless "
        "the champion is a model retrained from feedback.",
    )
    def _check(context, tracking: MLflowTracking) -> AssetCheckResult:
        report_dir = latest_path(context, key)
        report = json.loads((report_dir / "report.json").read_text())
        passed = bool(report["merged_not_worse"])
        promoted = {}
        if passed:
            merged = report_merged_dir(report_dir)
            # replaces a champion from this pipeline's own merges, never a retrained one (that one learned from
            # feedback, and this report does not compare with it): then this model stays the challenger
            promoted = promote_merged(
                context,
                key.path[0],
                tracking,
                merged,
                f"{key.to_user_string()}: not worse than the base model",
                only_over=(f"{key.path[0]}/{Path(merged).parent.name}",),
            )
        return AssetCheckResult(
            passed=passed,
            severity=AssetCheckSeverity.WARN,
            metadata={
                "base_eval_loss": report["base"]["eval_loss"],
                "merged_eval_loss": report["merged"]["eval_loss"],
                **promoted,
            },
        )

    return _check


def thirds(rows: list[dict], column: str) -> tuple[float, float] | None:
    """Mean of a progress column over the first and the last third of the logged steps."""
    values = [r[column] for r in rows if isinstance(r.get(column), (int, float))]
    if len(values) < 3:
        return None
    n = max(1, len(values) // 3)
    return sum(values[:n]) / n, sum(values[-n:]) / n


HACKING_MARGIN = 0.05  # a reward mean must move by more than this to count as rising or falling


def opposed_moves(kinds: dict, moves: dict[str, tuple[float, float]], margin: float = HACKING_MARGIN):
    """Format-type rewards that rose and accuracy-type rewards that fell, from (before, after) pairs by name."""
    rising = [n for n, (b, a) in moves.items() if kinds.get(n) in FORMAT_TYPES and a > b + margin]
    falling = [n for n, (b, a) in moves.items() if kinds.get(n) in ACCURACY_TYPES and a < b - margin]
    return rising, falling


def held_out_moves(result: dict, kinds: dict) -> dict[str, tuple[float, float]]:
    """Each reward's mean on the held-out prompts before and after training (rewards with both figures)."""
    before, after = result.get("per_reward_before") or {}, result.get("per_reward_after") or {}
    return {
        n: (float(before[n]), float(after[n]))
        for n in kinds
        if isinstance(before.get(n), (int, float)) and isinstance(after.get(n), (int, float))
    }


def grpo_checks(
    key: AssetKey,
    kl_bound: float,
    zero_std_limit: float,
    truncation_limit: float = 0.25,
    block_on_reward_hacking: bool = False,
):
    """Reward hacking guards (grpo-rlvr notes): format up while accuracy down (training trend and held-out
    before/after; blocking with severity ERROR when asked), runaway KL, no signal, completions cut off."""
    from ..engine.train.grpo import mean_clipped_ratio, suggest_max_new_tokens

    def artifact(context):
        path = latest_path(context, key)
        return path, json.loads((path / "manifest.json").read_text())

    def rows_and_kinds(context):
        path, manifest = artifact(context)
        return progress.read(path), manifest["result"].get("reward_kinds", {})

    @asset_check(
        asset=key,
        name="format_not_rising_while_accuracy_falls",
        blocking=block_on_reward_hacking,
        description="Flags a format or length reward that rises while an accuracy reward falls, over the "
        "training steps (first third against last) or on the held-out prompts (before "
        "training against after)" + ("; blocks the stages after it." if block_on_reward_hacking else "."),
    )
    def _hacking(context) -> AssetCheckResult:
        path, manifest = artifact(context)
        rows, result = progress.read(path), manifest["result"]
        kinds = result.get("reward_kinds", {})
        trends = {name: t for name in kinds if (t := thirds(rows, f"reward_{name}"))}
        rising, falling = opposed_moves(kinds, trends)
        held = held_out_moves(result, kinds)
        held_rising, held_falling = opposed_moves(kinds, held)
        hacked = bool(rising and falling) or bool(held_rising and held_falling)
        metadata = {
            "format_rising": ", ".join(rising) or "-",
            "accuracy_falling": ", ".join(falling) or "-",
            "held_out_format_rising": ", ".join(held_rising) or "-",
            "held_out_accuracy_falling": ", ".join(held_falling) or "-",
            "margin": HACKING_MARGIN,
            "blocking": block_on_reward_hacking,
        }
        for name, (before, after) in held.items():
            metadata[f"reward_before/{name}"], metadata[f"reward_after/{name}"] = before, after
        why = []
        if rising and falling:
            why.append(f"during training {', '.join(rising)} rose while {', '.join(falling)} fell")
        if held_rising and held_falling:
            why.append(
                "on the held-out prompts "
                + ", ".join(f"{n} went {held[n][0]:.3f} -> {held[n][1]:.3f}" for n in held_rising + held_falling)
            )
        description = (
            "Reward hacking suspected: " + "; ".join(why) + ". The adapter is optimizing the format "
            "reward at the cost of accuracy."
            if hacked
            else None
        )
        return AssetCheckResult(
            passed=not hacked,
            description=description,
            metadata=metadata,
            severity=AssetCheckSeverity.ERROR if block_on_reward_hacking else AssetCheckSeverity.WARN,
        )

    @asset_check(asset=key, name="kl_within_bound", description=f"KL to the starting model stays under {kl_bound}.")
    def _kl(context) -> AssetCheckResult:
        rows, _ = rows_and_kinds(context)
        kls = [r["kl"] for r in rows if isinstance(r.get("kl"), (int, float))]
        peak = max(kls, default=0.0)
        return AssetCheckResult(
            passed=peak <= kl_bound,
            severity=AssetCheckSeverity.WARN,
            metadata={"max_kl": float(peak), "bound": kl_bound, "logged_steps": len(kls)},
        )

    @asset_check(
        asset=key,
        name="groups_have_reward_variance",
        description=f"Share of groups whose completions all scored the same on the accuracy rewards "
        f"(no learning signal) stays under {zero_std_limit}.",
    )
    def _variance(context) -> AssetCheckResult:
        rows, kinds = rows_and_kinds(context)
        groups_file = latest_path(context, key) / "groups.jsonl"
        records = [json.loads(line) for line in groups_file.read_text().splitlines()] if groups_file.exists() else []
        accuracy = {n for n, kind in kinds.items() if kind in ACCURACY_TYPES} or set(kinds)
        shares = [r["zero_std_frac"] for r in records if r["reward"] in accuracy]
        if not shares:  # older artifacts: TRL's figure on the total reward
            shares = [r["zero_std_frac"] for r in rows if isinstance(r.get("zero_std_frac"), (int, float))]
        share = sum(shares) / len(shares) if shares else 1.0
        return AssetCheckResult(
            passed=share < zero_std_limit,
            severity=AssetCheckSeverity.WARN,
            metadata={
                "mean_zero_std_frac": float(share),
                "limit": zero_std_limit,
                "rewards": ", ".join(sorted(accuracy)),
            },
        )

    @asset_check(
        asset=key,
        name="completions_not_truncated",
        description=f"Mean share of training completions cut off at max_new_tokens stays at or under "
        f"{truncation_limit} (a cut-off completion seldom reaches its answer).",
    )
    def _truncation(context) -> AssetCheckResult:
        path, manifest = artifact(context)
        result = manifest["result"]
        ratio = mean_clipped_ratio(progress.read(path))
        current = result.get("max_new_tokens") or (manifest.get("settings") or {}).get("max_new_tokens")
        metadata = {
            "mean_clipped_ratio": float(ratio) if ratio is not None else "not logged",
            "limit": truncation_limit,
            "max_new_tokens": current if current is not None else "unknown",
        }
        if ratio is None or ratio <= truncation_limit:
            return AssetCheckResult(passed=True, severity=AssetCheckSeverity.WARN, metadata=metadata)
        suggested = result.get("suggested_max_new_tokens") or (
            suggest_max_new_tokens(current, result.get("longest_reference_tokens")) if current else None
        )
        metadata["suggested_max_new_tokens"] = suggested if suggested is not None else "unknown"
        if result.get("longest_reference_tokens") is not None:
            metadata["longest_reference_tokens"] = result["longest_reference_tokens"]
        return AssetCheckResult(
            passed=False,
            severity=AssetCheckSeverity.WARN,
            metadata=metadata,
            description=f"{ratio:.0%} of completions were cut off at max_new_tokens={current}: rewards that read the "
            f"answer at the end scored nothing, so the stage learned little. Raise the stage's "
            f"max_new_tokens" + (f" (try {suggested})." if suggested else "."),
        )

    return [_hacking, _kl, _variance, _truncation]


CHECKS = {  # check family (registry.StageKind.checks) -> the checks it attaches to a stage's asset
    "dataset_quality": lambda key, stage: [dataset_check(key)],
    "held_out_leakage": lambda key, stage: [
        leakage_check(key, stage.allow_leakage, answers_count=stage.kind != "prompt_dataset")
    ],
    "adapter_learned": lambda key, stage: [adapter_check(key)],
    "reward_hacking": lambda key, stage: grpo_checks(
        key, stage.kl_bound, stage.zero_std_limit, stage.truncation_limit, stage.block_on_reward_hacking
    ),
    "report_not_worse": lambda key, stage: [report_check(key)],
}


def build_checks(pipeline: Pipeline) -> list:
    checks = []
    for stage in pipeline.stages:
        for family in KINDS[stage.kind].checks:
            checks += CHECKS[family](AssetKey([pipeline.name, stage.name]), stage)
    return checks
