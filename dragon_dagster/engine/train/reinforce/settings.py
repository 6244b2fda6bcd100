"""What the reinforcement kinds share (stages/grpo, stages/rloo: one TRL config/trainer pair each): the rewards
they optimize and the guard they watch, groups of sampled completions, the KL to the starting model, the checks'
limits and the checks made when the pipeline loads (dragon_reinforce's arguments)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from ...config.stage import METRICS_DOC, MetricNames, check_pass_k
from ...config.training import TrainArgs
from ...rewards import ACCURACY_TYPES, LEARNED_TYPES, Reward, RewardSpec, known_types
from .. import distributed
from ..stage import TrainerStage
from ..trl_config import TrainerRun, trl_config

# What every reinforcement kind names otherwise than TRL (beta and temperature are TRL's names too).
REINFORCE_NAMES = {"group_size": "num_generations", "max_new_tokens": "max_completion_length"}


class ReinforceArgs(TrainArgs):
    """dragon_reinforce's defaults: one pass, no accumulation, frequent checkpoints (each step samples)."""

    epochs: float = Field(1, gt=0, description="Passes over the prompts.")
    learning_rate: float = Field(1e-5, gt=0, allow_inf_nan=False, description="Peak learning rate of the LoRA weights.")
    grad_accum: int = Field(1, gt=0, description="Steps whose gradients add up to one update.")
    save_steps: int = Field(20, gt=0, description="Save a resumable checkpoint every this many steps.")

    @model_validator(mode="after")
    def _watch_the_reward(self):
        if self.early_stopping is not None and self.early_stopping.metric.endswith("loss"):
            raise ValueError(
                f"early_stopping.metric {self.early_stopping.metric!r}: a policy-gradient loss is no measure of "
                "progress (it sits near 0 whatever the rewards do); watch the held-out reward TRL logs on "
                "evaluation: metric: eval_reward"
            )
        return self

    def best_metric(self) -> str:
        """The held-out reward (TRL's eval_reward on the sampled completions), not the loss."""
        return self.early_stopping.metric if self.early_stopping else "eval_reward"


class ReinforceStage(TrainerStage):
    """A policy trained on rewards of its own samples: each prompt answered group_size times, each completion's
    advantage its reward against the others of its group (dragon_reinforce)."""

    rewards: list[RewardSpec] = Field(
        min_length=1,
        description="Verifiable rewards, summed by weight, e.g. [{type: numeric}, "
        "{type: length, max_chars: 16, weight: 0.2}]; see the rewards reference for the types and their options.",
    )
    group_size: int = Field(4, ge=2, le=64, description="Completions per prompt, 2..64.")

    beta: float = Field(0.04, ge=0, le=10, description="KL penalty to the starting model, 0..10.")
    temperature: float = Field(1.0, ge=0.05, le=3, description="Sampling temperature, 0.05..3.")
    max_new_tokens: int = Field(
        128,
        gt=0,
        description="Rollout length: the most tokens a sampled completion may have while training (TRL's "
        "max_completion_length), and the length limit of the held-out replies scored before and after.",
    )
    max_eval_prompts: int = Field(64, ge=0, description="Held-out prompts scored before and after training.")
    kl_target: float | None = Field(
        None,
        gt=0,
        description="Hold the KL to the starting model near this value with an adaptive controller (Ziegler et al. "
        "2019): beta, the starting coefficient, is moved after each logged step, up when the KL is above target "
        "and down when below (train/beta in MLflow, beta in progress.jsonl). null: a fixed beta.",
    )
    kl_horizon: int = Field(
        1024,
        gt=0,
        description="How fast the controller moves beta: at the clip (KL 20% off target or more) by 20% over this "
        "many sampled completions (batch_size x group_size a step).",
    )
    kl_bound: float = Field(1.0, gt=0, description="The kl_within_bound check warns above this KL.")
    pass_samples: int = Field(
        0,
        ge=0,
        description="Completions sampled per held-out prompt at the stage's temperature, before and after training, "
        "for pass@1 and pass@k of each accuracy-like reward (eval/pass_at_1_<reward>, eval/pass_at_<k>_<reward>) and a "
        "sign test over the prompts. 0: greedy accuracy only (each sample costs a held-out reply, twice).",
    )
    pass_k: int = Field(4, ge=1, description="The k of pass@k: tries per prompt, at most pass_samples.")
    difficulty_samples: int = Field(
        0,
        ge=0,
        description="Before training, sample this many completions of each training prompt with the starting model "
        "(at the stage's temperature) and train only on the prompts it gets right some of the time on an "
        "accuracy-like reward: a prompt always right or always wrong gives a group with no reward spread, which "
        "teaches nothing. The kept share is in the result. 0: train on every prompt.",
    )
    difficulty_prompts: int | None = Field(
        None,
        gt=0,
        description="Score at most this many training prompts (the first, in the dataset's order) for the "
        "difficulty filter; null: all of them (each costs difficulty_samples replies).",
    )
    zero_std_limit: float = Field(
        0.9,
        gt=0,
        le=1,
        description="The groups_have_reward_variance check warns when this share of groups has no reward variance.",
    )
    truncation_limit: float = Field(
        0.25,
        gt=0,
        le=1,
        description="The completions_not_truncated check warns when more than this share of completions is cut off "
        "at max_new_tokens (mean over the steps).",
    )
    guard: list[RewardSpec] = Field(
        default_factory=list,
        description="Rewards never trained on, scored on the held-out prompts before and after training: what a "
        "policy exploiting a learned reward (reward_model) would lose while its reward climbs, e.g. a verifiable "
        "reward or a second reward model. The reward-hacking check compares them with the learned rewards.",
    )
    guard_metrics: MetricNames = Field(
        None,
        description="Reference metrics of the held-out replies watched the same way (prompts with a reference "
        "column). Default: token_f1 when the stage optimizes a learned reward and the prompts have references. "
        + METRICS_DOC.split(". ", 1)[0]
        + ".",
    )
    block_on_reward_hacking: bool = Field(
        False,
        description="Make format_not_rising_while_accuracy_falls a blocking check with severity ERROR: when "
        "it fails, the stages after this one are not materialized in the same run.",
    )
    args: ReinforceArgs = Field(default_factory=ReinforceArgs, description="Trainer arguments.")

    _known_reward_types = known_types("rewards", "rewards")
    _known_guard_types = known_types("guard", "guard")

    def base_changing_init_problem(self) -> str | None:
        if self.beta == 0:
            return None  # no KL term: TRL takes no reference
        return (
            f"{self.kind}'s KL penalty (beta {self.beta}) is measured against the policy with its adapter off; "
            "set beta 0 to train without it"
        )

    def rewards_used(self) -> list[Reward]:
        """The trained rewards, then the guard's (one list: the step checks and copies them alike)."""
        return [*self.rewards, *self.guard]

    def with_rewards(self, rewards: list[Reward]) -> ReinforceStage:
        n = len(self.rewards)
        return self.model_copy(update={"rewards": rewards[:n], "guard": rewards[n:]})

    def learned_rewards(self) -> list[str]:
        return [r.name for r in self.rewards if r.type in LEARNED_TYPES]

    def scorers(self) -> list[str]:
        return list(dict.fromkeys(r.stage for r in [*self.rewards, *self.guard] if r.type in LEARNED_TYPES))

    def watched_metrics(self, has_references: bool) -> list[str]:
        """The reference metrics scored before and after: guard_metrics, else token_f1 for a learned reward."""
        if self.guard_metrics is not None:
            return self.guard_metrics
        return ["token_f1"] if self.learned_rewards() and has_references else []

    @model_validator(mode="after")
    def _difficulty_reads_accuracy(self):
        if self.difficulty_samples == 1:
            raise ValueError(
                f"{self.kind} stage {self.name!r}: difficulty_samples 1 cannot tell a prompt the model gets right "
                "some of the time: sample at least 2 (8 is usual), or 0 to keep every prompt"
            )
        if self.difficulty_samples and not any(r.type in ACCURACY_TYPES for r in self.rewards):
            raise ValueError(
                f"{self.kind} stage {self.name!r}: the difficulty filter keeps prompts by how often they are right, "
                f"which an accuracy-like reward ({', '.join(ACCURACY_TYPES)}) says; its rewards have none"
            )
        return self

    @model_validator(mode="after")
    def _pass_k_fits(self):
        check_pass_k(self)
        return self

    @model_validator(mode="after")
    def _controlled_beta(self):
        if self.kl_target is not None and self.beta == 0:
            raise ValueError(
                f"{self.kind} stage {self.name!r}: kl_target moves beta from its starting value, and beta is 0 (TRL "
                "then computes no KL at all): set beta to a starting coefficient, e.g. 0.04"
            )
        return self

    def check_inputs(self, pipeline) -> None:
        """A reward_model reward names a reward_model stage; a learned reward has something untrained to watch."""
        for name in self.scorers():
            scorer = pipeline.stage_or_none(name)
            if scorer is None or not scorer.scores_replies:
                raise ValueError(
                    f"{self.kind} stage {self.name!r}: a reward_model reward names {name!r}, which is "
                    f"{'a ' + scorer.kind + ' stage' if scorer else 'not a stage'}; name an earlier reward_model "
                    "stage"
                )
        learned = self.learned_rewards()
        prompts = pipeline.stage_or_none(self.dataset)
        references = bool(getattr(prompts, "reference", None))
        if learned and not self.guard and not references:
            raise ValueError(
                f"{self.kind} stage {self.name!r} optimizes the learned reward(s) {learned} and watches nothing it is "
                "not trained on, so over-optimization would go unseen: add `guard:` (a verifiable reward or another "
                f"reward model) or map a reference column in {self.dataset!r} (its token_f1 is then watched)"
            )
        if self.guard_metrics and not references:
            raise ValueError(
                f"{self.kind} stage {self.name!r}: guard_metrics {self.guard_metrics} compare with references, but "
                f"{self.dataset!r} maps no reference column"
            )

    def preflight(self, pipeline) -> list[str]:
        """A reward that compares with a reference, on prompts whose dataset maps no reference column."""
        prompts = pipeline.stage(self.dataset)
        needing = [r.name or r.type for r in self.rewards if r.needs_reference]
        maps_reference = "reference" in type(prompts).model_fields
        if needing and maps_reference and not prompts.reference:
            return [
                f"{self.name}: reward(s) {needing} compare with a reference, but {prompts.name} "
                "maps no reference column"
            ]
        return []

    def uses_tools(self) -> bool:
        """Whether the rollouts run the pipeline's tools (a kind whose trainer has TRL's tool loop)."""
        return False

    def drops_flat_groups(self) -> bool:
        """Whether groups whose completions all scored the same are left out of the loss (a kind whose trainer
        takes a token mask for its loss)."""
        return False


def reinforce_config(config_class: type, settings: ReinforceStage, run: TrainerRun, **given: Any):
    """A reinforcement kind's TRL config: its settings by name (REINFORCE_NAMES where TRL's differ); args.batch_size
    counts prompts, so a rank's batch holds its share of them times group_size completions; speed's
    generation_batch_size lets one sampling round feed several optimizer steps. given: what the worker sets from
    the rewards and the tools."""
    batch = per_worker_completions(settings.args.batch_size, settings.group_size, run.workers)
    speed = run.speed
    sampling = {"generation_batch_size": speed.generation_batch_size} if speed and speed.generation_batch_size else {}
    return trl_config(
        config_class,
        settings,
        run,
        REINFORCE_NAMES,
        per_device_train_batch_size=batch,
        per_device_eval_batch_size=batch,  # whole groups, as TRL's evaluation samples them (eval_every)
        log_completions=False,
        **sampling,
        **given,
    )


def per_worker_completions(batch_size: int, group_size: int, workers: int) -> int:
    """Completions each worker scores per step: batch_size counts prompts across all workers (the global
    batch), each answered group_size times; TRL gathers the rewards, so a group may span workers."""
    return distributed.split_batch(
        batch_size * group_size,
        workers,
        what=f"batch_size x group_size (completions per step, {batch_size} x {group_size})",
    )
