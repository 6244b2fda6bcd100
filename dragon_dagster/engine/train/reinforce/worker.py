"""The reinforcement kinds' run (grpo, rloo): TRL's GRPOTrainer or RLOOTrainer on a LoRA adapter, with the
rewards, the guard, the held-out scoring and the summary they share; each kind's worker names its trainer and
the function that builds its TRL config from its settings (stages/<kind>/trl_config.py).

Each prompt is answered group_size times; a completion's advantage is its reward against its group's
mean, so a group whose completions all score the same teaches nothing (the reason the bundled arithmetic
prompts sit where the model is right about half the time). Held-out prompts are scored greedily before
(adapter off: the model the stage started from) and after training, so the stage's gain is visible.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from statistics import mean
from typing import Any

from ...artifacts import progress
from ...config.reporter import Reporter
from ...evaluate.pass_at_k import compare, right_counts
from ...evaluate.plots import plot_loss
from ...infer.generation import generate
from ...infer.tool_loop import converse, transcript
from ...rewards import RewardSet, trl_reward_funcs
from ...text.matchers import MATCHERS
from ...tools import template
from ...tools.declare import Toolset
from .. import distributed, held_out, lm_head
from ..trainer import TrainingError, TrainingJob, apply_speed, lora_config, prepare, progress_callback, run_trainer
from ..trl_config import TrainerRun
from ..variants import as_started
from .checks import mean_clipped_ratio, suggest_max_new_tokens
from .kl_control import AdaptiveKL, kl_control_callback
from .result import ReinforceResult
from .settings import per_worker_completions
from .trainer import fast_trainer


def adaptive_kl(settings, completions_per_step: int, reporter: Reporter):
    """The callback of the stage's adaptive KL controller (kl_control.py); None for a fixed beta."""
    if settings.kl_target is None:
        return None
    reporter.log(
        f"adaptive KL: beta starts at {settings.beta}, moved to hold KL near {settings.kl_target} "
        f"(horizon {settings.kl_horizon} completions)"
    )
    controller = AdaptiveKL(settings.beta, settings.kl_target, settings.kl_horizon)
    return kl_control_callback(controller, completions_per_step)


def validate(job: TrainingJob) -> tuple[RewardSet, RewardSet | None]:
    """What the settings model cannot see: the resource's generation batch against the stage's step, and the
    step's completions against the data-parallel workers that share them."""
    generation = job.speed.generation_batch_size if job.speed else None
    step = job.settings.args.batch_size * job.settings.group_size
    per_worker_completions(job.settings.args.batch_size, job.settings.group_size, distributed.world_size())
    if generation and generation % step:  # checked before a model loads
        raise ValueError(
            f"speed.generation_batch_size ({generation}) must be a multiple of one step's "
            f"completions, batch_size x group_size = {step}"
        )
    # custom files were copied into the artifact, their paths written relative to it
    base = job.output_dir
    missing = sorted(set(job.settings.scorers()) - {m.stage for m in job.inputs.reward_models})
    if missing:
        raise ValueError(
            f"{job.settings.kind} stage {job.settings.name!r}: its job carries no model for reward_model "
            f"stage(s) {missing}"
        )
    trained = RewardSet(job.settings.rewards, base_dir=base)
    return trained, RewardSet(job.settings.guard, base_dir=base) if job.settings.guard else None


def load_scorers(job: TrainingJob, reporter: Reporter) -> dict:
    """The reward models the stage's learned rewards name, loaded once each: stage name -> scorer."""
    from ...infer.reward_model import load_scorer

    scorers = {}
    for entry in job.inputs.reward_models:
        reporter.log(f"loading reward model {entry.stage} ({entry.adapter})")
        scorer = load_scorer(entry.model, entry.adapter, job.hardware, max_length=job.settings.args.max_seq_len)
        scorers[entry.stage] = scorer.score
    return scorers


def watched(rows: list[dict], texts: list[str], guard: RewardSet | None, metrics: list[str]) -> dict[str, float]:
    """The guard: rewards never trained on and reference metrics, each one's mean over the held-out replies."""
    out = {}
    if guard is not None:
        scores = guard.score(texts, rows, on_error="zero")
        out.update({name: mean(values) for name, values in scores.scores.items()})
    for name in metrics:
        pairs = [(t, r["reference"]) for t, r in zip(texts, rows) if r.get("reference") not in (None, "")]
        if pairs:
            out[name] = mean(MATCHERS[name](t, str(ref)) for t, ref in pairs)
    return out


def progress_columns(rewards: RewardSet) -> dict[str, str]:
    """TRL's log keys as dragonfarm's progress columns."""
    columns = {
        "completions/mean_length": "completion_len",
        "frac_reward_zero_std": "zero_std_frac",
        "completions/clipped_ratio": "clipped_ratio",
    }  # share of completions cut at max_new_tokens
    columns.update({f"rewards/{name}/mean": f"reward_{name}" for name in rewards.names})
    return columns


def longest_reference_tokens(tokenizer, rows: list[dict]) -> int | None:
    """Length in tokens of the longest reference among the rows (None when no row has one)."""
    references = [str(r["reference"]) for r in rows if r.get("reference") not in (None, "")]
    if not references:
        return None
    return max(len(ids) for ids in tokenizer(references, add_special_tokens=False)["input_ids"])


def last_kl(rows: list[dict]) -> float | None:
    """The KL to the starting model over the last third of the logged steps (TRL logs it when beta > 0)."""
    values = [r["kl"] for r in rows if isinstance(r.get("kl"), (int, float))]
    if not values:
        return None
    tail = values[-max(1, len(values) // 3) :]
    return sum(tail) / len(tail)


def truncation_warning(summary: ReinforceResult, limit: float) -> str | None:
    """The worker's closing warning when completions were mostly cut off: the cause and the setting to raise."""
    ratio = summary.clipped_ratio
    if ratio is None or ratio <= limit:
        return None
    return (
        f"WARNING: {ratio:.0%} of completions were cut off at max_new_tokens={summary.max_new_tokens} "
        f"(limit {limit:.0%}): rewards that read the answer at the end see none, so there is little to learn; "
        f"raise max_new_tokens (try {summary.suggested_max_new_tokens})"
    )


def watch_groups(funcs: list, group_size: int, out: Path) -> list:
    """Wrap TRL reward functions to record, per reward, the share of groups whose samples all scored the same.

    TRL's frac_reward_zero_std is taken on the weighted total, which a continuous reward such as length
    keeps near 0 even when no group disagrees on correctness; per reward is what shows a missing signal.
    With several workers each scores its own completions, and rank 0 records its share of the groups: the
    artifact is rank 0's to write (another node's rank may not even see its folder).
    """
    main = distributed.is_main()

    def wrap(func):
        def watched(prompts, completions, completion_ids=None, **kwargs):
            scores = func(prompts, completions, completion_ids, **kwargs)
            if not main:
                return scores
            groups = [scores[i : i + group_size] for i in range(0, len(scores), group_size)]
            frac = mean(max(g) == min(g) for g in groups) if groups else 1.0
            with (out / "groups.jsonl").open("a") as f:
                f.write(json.dumps({"reward": func.__name__, "zero_std_frac": frac}) + "\n")
            return scores

        watched.__name__ = func.__name__
        return watched

    return [wrap(f) for f in funcs]


def sampled(model, tokenizer, rows: list[dict], rewards: RewardSet, settings, toolset: Toolset | None) -> dict:
    """Per accuracy-like reward, each held-out prompt's right count of pass_samples completions sampled at the
    stage's temperature (pass@k's input); empty when pass_samples is 0 or the rollouts run tools (a sampled reply
    there is a conversation the tool loop runs, which plain sampling does not)."""
    if not settings.pass_samples or toolset is not None:
        return {}
    return right_counts(
        model,
        tokenizer,
        rows,
        rewards,
        settings.pass_samples,
        settings.temperature,
        settings.max_new_tokens,
        settings.args.seed,
    )


def keep_mixed(model, tokenizer, rows: list[dict], rewards: RewardSet, settings, reporter: Reporter):
    """The difficulty filter: the training rows the starting model gets right some of the time on an accuracy-like
    reward (of difficulty_samples completions, some right and some wrong), and what it found."""
    scored = rows[: settings.difficulty_prompts] if settings.difficulty_prompts else rows
    n = settings.difficulty_samples
    counts = right_counts(
        model, tokenizer, scored, rewards, n, settings.temperature, settings.max_new_tokens, settings.args.seed
    )
    mixed = [any(0 < per_row[i] < n for per_row in counts.values()) for i in range(len(scored))]
    found = {
        "scored": len(scored),
        "samples": n,
        "kept": sum(mixed),
        "always_right": sum(all(per_row[i] == n for per_row in counts.values()) for i in range(len(scored))),
        "never_right": sum(all(per_row[i] == 0 for per_row in counts.values()) for i in range(len(scored))),
    }
    found["kept_share"] = found["kept"] / max(1, len(scored))
    reporter.log(
        f"difficulty filter: {found['kept']} of {len(scored)} prompts right some of the time in {n} samples "
        f"(always right {found['always_right']}, never {found['never_right']})"
    )
    if not found["kept"]:
        raise TrainingError(
            f"{settings.kind} stage {settings.name!r}: the difficulty filter kept no prompt: the starting model got "
            f"each of the {len(scored)} scored right in all or none of {n} samples. Raise temperature or "
            "difficulty_samples, score more prompts (difficulty_prompts), or use prompts nearer its level"
        )
    return [row for row, keep in zip(scored, mixed) if keep], found


def score_prompts(
    model, tokenizer, rows: list[dict], rewards: RewardSet, max_new_tokens: int, toolset: Toolset | None = None
) -> dict:
    """Greedy completions for the rows, scored: mean total reward and mean per reward. With a toolset each
    completion is a conversation whose calls were run (infer/tool_loop.py), as in training; the rewards score its
    final answer, tool_call its calls."""
    prompts = [r["prompt"] for r in rows]
    if toolset is None:
        completions = generate(model, tokenizer, prompts, max_new_tokens=max_new_tokens)
        texts = completions
    else:
        completions = converse(model, tokenizer, prompts, toolset, max_new_tokens=max_new_tokens)
        texts = [transcript(turns) for turns in completions]
    scores = rewards.score(completions, rows, on_error="zero")
    return {
        "reward": mean(scores.total),
        "per_reward": {n: mean(v) for n, v in scores.scores.items()},
        "completions": texts,
        "totals": scores.total,
        "errors": scores.errors,
    }


def train_reinforce(
    job: TrainingJob,
    reporter: Reporter,
    trainer_class: type,
    to_config: Callable[..., Any],
    result: type[ReinforceResult],
) -> ReinforceResult | None:
    """Train job's stage with TRL's trainer class (GRPOTrainer, RLOOTrainer) and its kind's to_trl_config: the
    held-out prompts scored before and after, the rewards and the guard as every reinforcement kind has them."""
    from datasets import Dataset

    rewards, guard = validate(job)
    toolset = Toolset.from_input(job.inputs.tools) if job.settings.uses_tools() else None
    if job.settings.uses_tools() and toolset is None:
        raise ValueError(
            f"{job.settings.kind} stage {job.settings.name!r} has tools: true, but its job carries no tools"
        )
    rewards.bind_tools(toolset.schemas if toolset else None)
    scorers = load_scorers(job, reporter)
    rewards.bind_scorers(scorers)
    if guard is not None:
        guard.bind_tools(toolset.schemas if toolset else None).bind_scorers(scorers)
    p = prepare(job)
    # before TRL sees the tokenizer: its tool loop renders the tools and parses calls with this template
    rendering = template.prepare(p.tokenizer, needed=True) if toolset else None
    rewards.check_rows(p.train_rows + p.eval_rows)  # a reward that needs a reference fails here, not mid-run
    if guard is not None:
        guard.check_rows(p.eval_rows or p.train_rows)
    difficulty = None
    if job.settings.difficulty_samples and toolset is None:
        p.train_rows, difficulty = keep_mixed(p.model, p.tokenizer, p.train_rows, rewards, job.settings, reporter)
    out = Path(job.output_dir)
    chunked = lm_head.use_chunked(p.speed, p.model, p.lora.peft_target_modules(), reporter)
    run = TrainerRun.of(job, p.speed, compiled_here=chunked, workers=p.workers)
    tool_calls = {"max_tool_calling_iterations": toolset.max_calls} if toolset else {}
    config = to_config(job.settings, run, reward_weights=rewards.weights(), **tool_calls)
    callback = progress_callback(reporter, out, columns=progress_columns(rewards))
    kl_control = adaptive_kl(job.settings, p.args.batch_size * job.settings.group_size, reporter)
    funcs = watch_groups(trl_reward_funcs(rewards, on_error="zero"), job.settings.group_size, out)
    trainer = fast_trainer(trainer_class)(
        model=p.model,
        reward_funcs=funcs,
        args=config,
        train_dataset=Dataset.from_list(p.train_rows),
        # the prompts scored before and after (max_eval_prompts): each evaluation samples a group for each one
        eval_dataset=held_out.eval_dataset(p.eval_rows[: job.settings.max_eval_prompts], p.args, Dataset.from_list),
        processing_class=p.tokenizer,
        peft_config=lora_config(p.lora),
        # beta set before the step is logged
        callbacks=[*([kl_control] if kl_control else []), callback, *held_out.callbacks(p.args)],
        **({"tools": toolset.callables()} if toolset else {}),
    )
    # with tools in the loop, TRL's own generation: the grouped sampler samples a group in lockstep from one
    # prefilled prompt, which a tool call in the middle of a completion breaks
    sampling = "trl (tools in the loop)" if toolset else p.speed.sampling
    speed = {**apply_speed(trainer, p.speed, chunked, reporter), "sampling": sampling}
    trainer.chunked, trainer.unpad = chunked, speed["unpad"]
    trainer.grouped_sampling = p.speed.sampling == "grouped" and toolset is None
    trainer.drop_flat = job.settings.drops_flat_groups()
    if kl_control:
        kl_control.trainer = trainer
    if toolset:
        reporter.log(f"tools in the loop: {', '.join(toolset.names)} ({rendering} rendering), rollouts by TRL")
    reporter.log(f"speed: {config.generation_batch_size} completions per generation round")
    held = (p.eval_rows or p.train_rows)[: job.settings.max_eval_prompts]
    metrics = job.settings.watched_metrics(any(r.get("reference") not in (None, "") for r in held))
    main = distributed.is_main()  # rank 0 scores the held-out prompts and writes the artifact
    if main:
        trainer.model.eval()
        with as_started(trainer.model, p.lora):  # the model this stage started from
            before = score_prompts(trainer.model, p.tokenizer, held, rewards, job.settings.max_new_tokens, toolset)
            before["pass"] = sampled(trainer.model, p.tokenizer, held, rewards, job.settings, toolset)
        before["guard"] = watched(held, before["completions"], guard, metrics)
        reporter.log(f"before training: mean reward {before['reward']:.3f} on {len(held)} prompts")
    trained = run_trainer(trainer, callback, job, reporter)
    if not main:
        return None
    trainer.model.eval()
    after = score_prompts(trainer.model, p.tokenizer, held, rewards, job.settings.max_new_tokens, toolset)
    after["pass"] = sampled(trainer.model, p.tokenizer, held, rewards, job.settings, toolset)
    after["guard"] = watched(held, after["completions"], guard, metrics)
    reporter.log(f"after training: mean reward {after['reward']:.3f} (before {before['reward']:.3f})")
    for name, value in after["guard"].items():
        reporter.log(f"guard {name} (not trained on): {before['guard'].get(name, float('nan')):.3f} -> {value:.3f}")
    summary = summarize(
        job,
        trainer,
        trained,
        result,
        rewards,
        held,
        bool(p.eval_rows),
        before,
        after,
        out,
        reporter,
        speed={**speed, "generation_batch_size": config.generation_batch_size},
        reference_tokens=longest_reference_tokens(p.tokenizer, p.train_rows + p.eval_rows),
        tools={"names": toolset.names, "rendering": rendering, **toolset.counts()} if toolset else None,
        guard_kinds={r.name: r.type for r in guard or []} | {m: "metric" for m in metrics},
        difficulty=difficulty,
        kept=held_out.kept_adapter(trainer, p.args),
        held_out_rows=held_out.held_out_rows(len(p.eval_rows[: job.settings.max_eval_prompts]), p.eval_total),
    )
    warning = truncation_warning(summary, job.settings.truncation_limit)
    if warning:
        reporter.log(warning)
    return summary


def summarize(
    job,
    trainer,
    result,
    result_model: type[ReinforceResult],
    rewards,
    held,
    held_out,
    before,
    after,
    out: Path,
    reporter,
    speed: dict,
    reference_tokens: int | None = None,
    tools: dict | None = None,
    guard_kinds: dict[str, str] | None = None,
    difficulty: dict | None = None,
    kept=None,
    held_out_rows=None,
) -> ReinforceResult:
    logged = progress.read(out)
    losses = [r["loss"] for r in logged if isinstance(r.get("loss"), (int, float))]
    summary = result_model(
        objective=job.settings.objective(),
        loss_label=f"{job.settings.kind.upper()} loss",
        speed=speed,
        global_step=trainer.state.global_step,
        train_loss=result.training_loss,
        first_loss=losses[0] if losses else None,
        last_loss=losses[-1] if losses else None,
        held_out=held_out,
        eval_prompts=len(held),
        rewards=rewards.to_list(relative_to=out),  # the report scores with them, custom files beside it
        reward_kinds={r.name: r.type for r in rewards},
        reward_before=before["reward"],
        reward_after=after["reward"],
        per_reward_before=before["per_reward"],
        per_reward_after=after["per_reward"],
        reward_errors=after["errors"],
        guard_kinds=guard_kinds or {},
        guard_before=before["guard"],
        guard_after=after["guard"],
        kl=last_kl(logged),
        group_size=job.settings.group_size,
        beta=job.settings.beta,
        beta_end=trainer.beta if job.settings.kl_target is not None else None,
        difficulty=difficulty,
        pass_at_k=compare(
            before["pass"],
            after["pass"],
            job.settings.pass_samples,
            job.settings.pass_k,
            job.settings.temperature,
            model=job.settings.name,
            against="start",
        ),
        temperature=job.settings.temperature,
        max_new_tokens=job.settings.max_new_tokens,
        clipped_ratio=mean_clipped_ratio(logged),
        longest_reference_tokens=reference_tokens,
        suggested_max_new_tokens=suggest_max_new_tokens(job.settings.max_new_tokens, reference_tokens),
        tools=tools,
        kept=kept,
        held_out_rows=held_out_rows,
    )
    with (out / "samples.jsonl").open("w") as f:
        for i, row in enumerate(held[: max(job.settings.n_samples, 0)]):
            f.write(
                json.dumps(
                    {
                        "prompt": row["prompt"][-1]["content"],
                        "reference": row.get("reference"),
                        "before": before["completions"][i],
                        "after": after["completions"][i],
                        "reward_before": before["totals"][i],
                        "reward_after": after["totals"][i],
                    },
                    ensure_ascii=False,
                )
                + "\n"
            )
    (out / "metrics.json").write_text(summary.model_dump_json(indent=2))
    plot_loss(logged, out / "loss.png", title=f"{job.settings.kind.upper()} loss and mean reward", extra="reward")
    final = {"eval/reward_before": before["reward"], "eval/reward": after["reward"]}
    final.update({f"eval/reward_{n}": v for n, v in after["per_reward"].items()})
    final.update({f"eval/guard_{n}": v for n, v in after["guard"].items()})
    final.update({f"eval/guard_before_{n}": v for n, v in before["guard"].items()})
    for change in summary.pass_at_k:  # the report logs the same names on the merged and the base run
        final.update({f"eval/{name}": v for name, v in change.figures("after").items()})
        final.update({f"eval/before_{name}": v for name, v in change.figures("before").items()})
    reporter.metrics(trainer.state.global_step, final)
    return summary
