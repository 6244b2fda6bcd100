"""Reinforcement learning with verifiable rewards: TRL's GRPOTrainer on a LoRA adapter.

Each prompt is answered group_size times; a completion's advantage is its reward against its group's
mean, so a group whose completions all score the same teaches nothing (the reason the bundled arithmetic
prompts sit where the model is right about half the time). Held-out prompts are scored greedily before
(adapter off: the model the stage started from) and after training, so the stage's gain is visible.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from statistics import mean

from .. import distributed
from ..evaluate.replies import generate
from ..reporter import Reporter
from ..rewards import RewardSet, trl_reward_funcs
from ..spec.stages import GRPO
from . import progress
from .trainer import StageJob, apply_speed, common_args, lora_config, prepare, progress_callback, run_trainer


@dataclass
class GRPOJob(StageJob):
    settings: GRPO


def validate(job: GRPOJob) -> RewardSet:
    """What the settings model cannot see: the resource's generation batch against the stage's step, and the
    step's completions against the data-parallel workers that share them."""
    generation = (job.speed or {}).get("generation_batch_size")
    step = job.settings.args.batch_size * job.settings.group_size
    per_worker_completions(job.settings.args.batch_size, job.settings.group_size, distributed.world_size())
    if generation and generation % step:  # checked before a model loads
        raise ValueError(
            f"speed.generation_batch_size ({generation}) must be a multiple of one step's "
            f"completions, batch_size x group_size = {step}"
        )
    return RewardSet.from_list(job.settings.rewards, base_dir=job.output_dir)  # custom files were copied in there


def per_worker_completions(batch_size: int, group_size: int, workers: int) -> int:
    """Completions each worker scores per step: batch_size counts prompts across all workers (the global
    batch), each answered group_size times; TRL gathers the rewards, so a group may span workers."""
    return distributed.split_batch(
        batch_size * group_size,
        workers,
        what=f"batch_size x group_size (completions per step, {batch_size} x {group_size})",
    )


def progress_columns(rewards: RewardSet) -> dict[str, str]:
    """TRL's log keys as dragonfarm's progress columns."""
    columns = {
        "completions/mean_length": "completion_len",
        "frac_reward_zero_std": "zero_std_frac",
        "completions/clipped_ratio": "clipped_ratio",
    }  # share of completions cut at max_new_tokens
    columns.update({f"rewards/{name}/mean": f"reward_{name}" for name in rewards.names})
    return columns


def mean_clipped_ratio(rows: list[dict]) -> float | None:
    """Mean share of completions cut off at max_new_tokens over the logged steps (None: not logged)."""
    values = [r["clipped_ratio"] for r in rows if isinstance(r.get("clipped_ratio"), (int, float))]
    return sum(values) / len(values) if values else None


def suggest_max_new_tokens(current: int, longest_reference: int | None = None) -> int:
    """A max_new_tokens to try when completions are cut off: twice the current one, and at least four times
    the longest reference in tokens (room for the working before the answer), rounded up to a multiple of 16."""
    want = max(2 * current, 4 * (longest_reference or 0))
    return -(-want // 16) * 16


def longest_reference_tokens(tokenizer, rows: list[dict]) -> int | None:
    """Length in tokens of the longest reference among the rows (None when no row has one)."""
    references = [str(r["reference"]) for r in rows if r.get("reference") not in (None, "")]
    if not references:
        return None
    return max(len(ids) for ids in tokenizer(references, add_special_tokens=False)["input_ids"])


def truncation_warning(summary: dict, limit: float) -> str | None:
    """The worker's closing warning when completions were mostly cut off: the cause and the setting to raise."""
    ratio = summary.get("clipped_ratio")
    if ratio is None or ratio <= limit:
        return None
    return (
        f"WARNING: {ratio:.0%} of completions were cut off at max_new_tokens={summary['max_new_tokens']} "
        f"(limit {limit:.0%}): rewards that read the answer at the end see none, so there is little to learn; "
        f"raise max_new_tokens (try {summary['suggested_max_new_tokens']})"
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


def score_prompts(model, tokenizer, rows: list[dict], rewards: RewardSet, max_new_tokens: int) -> dict:
    """Greedy completions for the rows, scored: mean total reward and mean per reward."""
    completions = generate(model, tokenizer, [r["prompt"] for r in rows], max_new_tokens=max_new_tokens)
    scores = rewards.score(completions, rows, on_error="zero")
    return {
        "reward": mean(scores.total),
        "per_reward": {n: mean(v) for n, v in scores.scores.items()},
        "completions": completions,
        "totals": scores.total,
        "errors": scores.errors,
    }


def train_grpo(job: GRPOJob, reporter: Reporter) -> dict:
    from datasets import Dataset
    from trl import GRPOConfig

    from . import lm_head

    rewards = validate(job)
    p = prepare(job)
    rewards.check_rows(p.train_rows + p.eval_rows)  # a reward that needs a reference fails here, not mid-run
    out = Path(job.output_dir)
    chunked = lm_head.use_chunked(p.speed, p.model, p.lora.peft_target_modules(), reporter)
    args = common_args(p.args, p.hardware, job.checkpoint_dir, p.speed, compiled_here=chunked)
    args["per_device_train_batch_size"] = per_worker_completions(
        p.args.batch_size, job.settings.group_size, p.workers
    )  # batch_size counts prompts
    if p.speed.generation_batch_size:  # one sampling round feeds several optimizer steps
        args["generation_batch_size"] = p.speed.generation_batch_size
    config = GRPOConfig(
        **args,
        num_generations=job.settings.group_size,
        max_completion_length=job.settings.max_new_tokens,
        temperature=job.settings.temperature,
        beta=job.settings.beta,
        reward_weights=rewards.weights(),
        log_completions=False,
    )
    callback = progress_callback(reporter, out, columns=progress_columns(rewards))
    funcs = watch_groups(trl_reward_funcs(rewards, on_error="zero"), job.settings.group_size, out)
    trainer = grpo_trainer()(
        model=p.model,
        reward_funcs=funcs,
        args=config,
        train_dataset=Dataset.from_list(p.train_rows),
        processing_class=p.tokenizer,
        peft_config=lora_config(p.lora),
        callbacks=[callback],
    )
    speed = {**apply_speed(trainer, p.speed, chunked, reporter), "sampling": p.speed.sampling}
    trainer.chunked, trainer.unpad, trainer.grouped_sampling = chunked, speed["unpad"], p.speed.sampling == "grouped"
    reporter.log(f"speed: {config.generation_batch_size} completions per generation round")
    held = (p.eval_rows or p.train_rows)[: job.settings.max_eval_prompts]
    main = distributed.is_main()  # rank 0 scores the held-out prompts and writes the artifact
    if main:
        trainer.model.eval()
        with trainer.model.disable_adapter():  # the model this stage started from
            before = score_prompts(trainer.model, p.tokenizer, held, rewards, job.settings.max_new_tokens)
        reporter.log(f"before training: mean reward {before['reward']:.3f} on {len(held)} prompts")
    result = run_trainer(trainer, callback, job, reporter)
    if not main:
        return {"global_step": trainer.state.global_step, "rank": distributed.rank()}
    trainer.model.eval()
    after = score_prompts(trainer.model, p.tokenizer, held, rewards, job.settings.max_new_tokens)
    reporter.log(f"after training: mean reward {after['reward']:.3f} (before {before['reward']:.3f})")
    summary = summarize(
        job,
        trainer,
        result,
        rewards,
        held,
        bool(p.eval_rows),
        before,
        after,
        out,
        reporter,
        reference_tokens=longest_reference_tokens(p.tokenizer, p.train_rows + p.eval_rows),
    )
    warning = truncation_warning(summary, job.settings.truncation_limit)
    if warning:
        reporter.log(warning)
    return {**summary, "speed": {**speed, "generation_batch_size": config.generation_batch_size}}


@functools.cache
def grpo_trainer():
    """GRPOTrainer with this project's speed paths, each off until set (built on first use):

    chunked: completions scored by lm_head.completion_logprobs (text-only models), over the real tokens only with
    unpad; grouped_sampling: rollout.sample (each group's prompt prefilled once, no dropout while sampling), whose
    recorded log-probabilities stand for the old policy's when a round serves several steps.
    """
    import torch
    from trl import GRPOTrainer

    from . import lm_head, rollout

    class FastGRPOTrainer(GRPOTrainer):
        chunked = unpad = grouped_sampling = False
        sampled = None  # (completions, tokens): the last round's sampled tokens' log-probabilities

        def _generate_single_turn(self, *args, **kwargs):
            if not self.grouped_sampling or self.use_vllm or self.use_transformers_continuous_batching:
                return super()._generate_single_turn(*args, **kwargs)
            record = []
            with rollout.sampling(self.accelerator.unwrap_model(self.model_wrapped), record):
                result = super()._generate_single_turn(*args, **kwargs)
            self.sampled = torch.stack(record, dim=1) if record else None
            return result

        def sampling_logps(self, model, input_ids, attention_mask, logits_to_keep, compute_entropy):
            """The old policy's log-probabilities as they were sampled, when this call asks for them: the first call
            without gradient after a round that serves several steps (TRL's old_per_token_logps; the reference pass
            comes after it, with the adapter off), with temperature the only change to the distribution."""
            sampled, self.sampled = self.sampled, None
            stale = self.args.gradient_accumulation_steps % (self.args.steps_per_generation * self.num_iterations)
            plain = (
                self.top_k in (None, 0)
                and self.top_p in (None, 1.0)
                and self.min_p is None
                and self.repetition_penalty == 1.0
            )
            if (
                sampled is None
                or not stale
                or not plain
                or compute_entropy
                or torch.is_grad_enabled()
                or sampled.shape[0] != input_ids.shape[0]
                or sampled.shape[1] < logits_to_keep
                or not adapter_on(self.accelerator.unwrap_model(model))
            ):
                return None
            return sampled[:, :logits_to_keep].to(input_ids.device) * attention_mask[:, -logits_to_keep:]

        def _get_per_token_logps_and_entropies(
            self,
            model,
            input_ids,
            attention_mask,
            logits_to_keep,
            batch_size=None,
            compute_entropy=False,
            compute_aux_loss=False,
            **multimodal,
        ):
            old = self.sampling_logps(model, input_ids, attention_mask, logits_to_keep, compute_entropy)
            if old is not None:
                return old, None, None
            if not self.chunked or compute_aux_loss or any(v is not None for v in multimodal.values()):
                return super()._get_per_token_logps_and_entropies(
                    model,
                    input_ids,
                    attention_mask,
                    logits_to_keep,
                    batch_size,
                    compute_entropy,
                    compute_aux_loss,
                    **multimodal,
                )
            batch_size = batch_size or input_ids.size(0)
            logps, entropies = [], []
            for start in range(0, input_ids.size(0), batch_size):
                rows = slice(start, start + batch_size)
                with self.accelerator.autocast():  # through DDP's forward, so that its backward all-reduces
                    lp, ent = lm_head.through_wrapper(
                        model,
                        lm_head.completion_logprobs,
                        input_ids[rows],
                        attention_mask[rows],
                        logits_to_keep,
                        self.temperature,
                        None,
                        self.unpad,
                        compute_entropy,
                    )
                logps.append(lp)
                entropies.append(ent)
            return torch.cat(logps), torch.cat(entropies) if compute_entropy else None, None

    return FastGRPOTrainer


def adapter_on(model) -> bool:
    """Whether model's LoRA adapters are active (TRL switches them off for the reference pass)."""
    layer = next((m for m in model.modules() if hasattr(m, "disable_adapters") and hasattr(m, "lora_A")), None)
    return layer is not None and not layer.disable_adapters


def summarize(
    job,
    trainer,
    result,
    rewards,
    held,
    held_out,
    before,
    after,
    out: Path,
    reporter,
    reference_tokens: int | None = None,
) -> dict:
    logged = progress.read(out)
    losses = [r["loss"] for r in logged if isinstance(r.get("loss"), (int, float))]
    summary = {
        "global_step": trainer.state.global_step,
        "train_loss": result.training_loss,
        "first_loss": losses[0] if losses else None,
        "last_loss": losses[-1] if losses else None,
        "held_out": held_out,
        "eval_prompts": len(held),
        "rewards": rewards.to_list(),
        "reward_kinds": {r.name: r.type for r in rewards},
        "reward_before": before["reward"],
        "reward_after": after["reward"],
        "per_reward_before": before["per_reward"],
        "per_reward_after": after["per_reward"],
        "reward_errors": after["errors"],
        "group_size": job.settings.group_size,
        "beta": job.settings.beta,
        "temperature": job.settings.temperature,
        "max_new_tokens": job.settings.max_new_tokens,
        "clipped_ratio": mean_clipped_ratio(logged),
        "longest_reference_tokens": reference_tokens,
        "suggested_max_new_tokens": suggest_max_new_tokens(job.settings.max_new_tokens, reference_tokens),
    }
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
    (out / "metrics.json").write_text(json.dumps(summary, indent=2))
    progress.plot_loss(logged, out / "loss.png", title="GRPO loss and mean reward", extra="reward")
    final = {"eval/reward_before": before["reward"], "eval/reward": after["reward"]}
    final.update({f"eval/reward_{n}": v for n, v in after["per_reward"].items()})
    reporter.metrics(trainer.state.global_step, final)
    return summary
