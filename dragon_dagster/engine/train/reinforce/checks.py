"""The reinforcement kinds' checks (the grpo-rlvr notes' reward-hacking guards): a format reward rising while an
accuracy reward falls (over the training steps, and on the held-out prompts before and after; blocking when the stage
asks), a runaway KL, groups with no reward variance (no learning signal), completions cut off at max_new_tokens."""

from __future__ import annotations

import json
from pathlib import Path

from ...artifacts import progress
from ...artifacts.manifest import AdapterManifest, read_manifest
from ...config.checks import CheckOutcome, CheckSpec
from ...rewards import ACCURACY_TYPES, FORMAT_TYPES, LEARNED_TYPES
from .result import ReinforceResult
from .settings import ReinforceStage


def mean_clipped_ratio(rows: list[dict]) -> float | None:
    """Mean share of completions cut off at max_new_tokens over the logged steps (None: not logged)."""
    values = [r["clipped_ratio"] for r in rows if isinstance(r.get("clipped_ratio"), (int, float))]
    return sum(values) / len(values) if values else None


def suggest_max_new_tokens(current: int, longest_reference: int | None = None) -> int:
    """A max_new_tokens to try when completions are cut off: twice the current one, and at least four times
    the longest reference in tokens (room for the working before the answer), rounded up to a multiple of 16."""
    want = max(2 * current, 4 * (longest_reference or 0))
    return -(-want // 16) * 16


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


def held_out_moves(result: ReinforceResult) -> dict[str, tuple[float, float]]:
    """Each reward's mean on the held-out prompts before and after training (rewards with both figures)."""
    before, after = result.per_reward_before, result.per_reward_after
    return {n: (float(before[n]), float(after[n])) for n in result.reward_kinds if n in before and n in after}


def over_optimized(result: ReinforceResult, margin: float = HACKING_MARGIN) -> tuple[list[str], list[str]]:
    """Learned rewards that rose on the held-out prompts and guards (never trained on) that fell: a policy
    climbing a reward model's mistakes rather than getting better."""
    held = held_out_moves(result)
    rising = [n for n, (b, a) in held.items() if result.reward_kinds.get(n) in LEARNED_TYPES and a > b + margin]
    guards = {n: (result.guard_before[n], v) for n, v in result.guard_after.items() if n in result.guard_before}
    falling = [n for n, (b, a) in guards.items() if a < b - margin]
    return rising, falling


def read_result(artifact: Path) -> ReinforceResult:
    return read_manifest(artifact, AdapterManifest[ReinforceResult]).result


def hacking_check(block: bool) -> CheckSpec:
    def judge(artifact: Path) -> CheckOutcome:
        result = read_result(artifact)
        rows, kinds = progress.read(artifact), result.reward_kinds
        trends = {name: t for name in kinds if (t := thirds(rows, f"reward_{name}"))}
        rising, falling = opposed_moves(kinds, trends)
        held = held_out_moves(result)
        held_rising, held_falling = opposed_moves(kinds, held)
        learned_rising, guard_falling = over_optimized(result)
        hacked = (
            bool(rising and falling) or bool(held_rising and held_falling) or bool(learned_rising and guard_falling)
        )
        metadata = {
            "format_rising": ", ".join(rising) or "-",
            "accuracy_falling": ", ".join(falling) or "-",
            "held_out_format_rising": ", ".join(held_rising) or "-",
            "held_out_accuracy_falling": ", ".join(held_falling) or "-",
            "learned_rising": ", ".join(learned_rising) or "-",
            "guard_falling": ", ".join(guard_falling) or "-",
            "margin": HACKING_MARGIN,
            "blocking": block,
        }
        for name, (before, after) in held.items():
            metadata[f"reward_before/{name}"], metadata[f"reward_after/{name}"] = before, after
        for name, after in result.guard_after.items():
            metadata[f"guard_before/{name}"] = result.guard_before.get(name, float("nan"))
            metadata[f"guard_after/{name}"] = after
        if result.kl is not None:
            metadata["kl"] = result.kl
        why = []
        if rising and falling:
            why.append(f"during training {', '.join(rising)} rose while {', '.join(falling)} fell")
        if held_rising and held_falling:
            why.append(
                "on the held-out prompts "
                + ", ".join(f"{n} went {held[n][0]:.3f} -> {held[n][1]:.3f}" for n in held_rising + held_falling)
            )
        if learned_rising and guard_falling:
            why.append(
                "the learned reward(s) "
                + ", ".join(f"{n} went {held[n][0]:.3f} -> {held[n][1]:.3f}" for n in learned_rising)
                + " while the guard "
                + ", ".join(
                    f"{n} fell {result.guard_before[n]:.3f} -> {result.guard_after[n]:.3f}" for n in guard_falling
                )
                + (f" (KL {result.kl:.3g})" if result.kl is not None else "")
            )
        description = (
            "Reward hacking suspected: " + "; ".join(why) + ". The adapter is optimizing a proxy (a format "
            "reward or a reward model) at the cost of what it stands for."
            if hacked
            else None
        )
        return CheckOutcome(not hacked, metadata, description, severity="error" if block else "warn")

    return CheckSpec(
        "format_not_rising_while_accuracy_falls",
        "Flags a format or length reward that rises while an accuracy reward falls, over the "
        "training steps (first third against last) or on the held-out prompts (before "
        "training against after), and a learned reward (reward_model) that rises on the held-out prompts while a "
        "guard the stage was not trained on falls" + ("; blocks the stages after it." if block else "."),
        judge,
        blocking=block,
    )


def kl_check(bound: float) -> CheckSpec:
    def judge(artifact: Path) -> CheckOutcome:
        kls = [r["kl"] for r in progress.read(artifact) if isinstance(r.get("kl"), (int, float))]
        peak = max(kls, default=0.0)
        description = (
            None
            if peak <= bound
            else f"The KL to the starting model reached {peak:.3g}, above kl_bound={bound}: the adapter moved far from "
            "the model it started from. Lower args.learning_rate or raise beta (or raise kl_bound if that is meant)."
        )
        return CheckOutcome(
            peak <= bound, {"max_kl": float(peak), "bound": bound, "logged_steps": len(kls)}, description
        )

    return CheckSpec("kl_within_bound", f"KL to the starting model stays under {bound}.", judge)


def variance_check(limit: float) -> CheckSpec:
    def judge(artifact: Path) -> CheckOutcome:
        kinds = read_result(artifact).reward_kinds
        groups_file = artifact / "groups.jsonl"
        records = [json.loads(line) for line in groups_file.read_text().splitlines()] if groups_file.exists() else []
        accuracy = {n for n, kind in kinds.items() if kind in ACCURACY_TYPES} or set(kinds)
        shares = [r["zero_std_frac"] for r in records if r["reward"] in accuracy]
        if not shares:  # older artifacts: TRL's figure on the total reward
            rows = progress.read(artifact)
            shares = [r["zero_std_frac"] for r in rows if isinstance(r.get("zero_std_frac"), (int, float))]
        share = sum(shares) / len(shares) if shares else 1.0
        metadata = {"mean_zero_std_frac": float(share), "limit": limit, "rewards": ", ".join(sorted(accuracy))}
        description = (
            None
            if share < limit
            else f"{share:.0%} of the groups had completions that all scored the same on {metadata['rewards']} "
            f"(zero_std_limit={limit}), so they taught nothing: raise temperature or group_size, or use prompts the "
            "model gets right some of the time (difficulty_samples keeps only those; on grpo, drop_flat_groups "
            "leaves the flat groups out of the loss)."
        )
        return CheckOutcome(share < limit, metadata, description)

    return CheckSpec(
        "groups_have_reward_variance",
        f"Share of groups whose completions all scored the same on the accuracy rewards (no learning signal) stays "
        f"under {limit}.",
        judge,
    )


def truncation_check(limit: float) -> CheckSpec:
    def judge(artifact: Path) -> CheckOutcome:
        result = read_result(artifact)
        ratio = mean_clipped_ratio(progress.read(artifact))
        current = result.max_new_tokens
        metadata = {
            "mean_clipped_ratio": float(ratio) if ratio is not None else "not logged",
            "limit": limit,
            "max_new_tokens": current,
        }
        if ratio is None or ratio <= limit:
            return CheckOutcome(True, metadata)
        suggested = result.suggested_max_new_tokens or suggest_max_new_tokens(current, result.longest_reference_tokens)
        metadata["suggested_max_new_tokens"] = suggested
        if result.longest_reference_tokens is not None:
            metadata["longest_reference_tokens"] = result.longest_reference_tokens
        return CheckOutcome(
            False,
            metadata,
            f"{ratio:.0%} of completions were cut off at max_new_tokens={current}: rewards that read the answer at "
            f"the end scored nothing, so the stage learned little. Raise the stage's max_new_tokens (try {suggested}).",
        )

    return CheckSpec(
        "completions_not_truncated",
        f"Mean share of training completions cut off at max_new_tokens stays at or under {limit} (a cut-off "
        "completion seldom reaches its answer).",
        judge,
    )


def reinforce_checks(stage: ReinforceStage) -> list[CheckSpec]:
    return [
        hacking_check(stage.block_on_reward_hacking),
        kl_check(stage.kl_bound),
        variance_check(stage.zero_std_limit),
        truncation_check(stage.truncation_limit),
    ]
