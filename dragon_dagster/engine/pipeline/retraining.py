"""Retraining from chat feedback, as a pipeline's `feedback:` section says: which objectives run (each a stage of
a fixed kind, continuing from the deployed model with lighter settings than the pipeline's), the report the gate
reads, and the promotion gate itself. The Dagster side is assets/retraining.py."""

from __future__ import annotations

import logging
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Discriminator, Field, Tag, model_validator

from ..config.settings import Settings
from ..config.training import TrainArgs
from ..data.pii import PiiMode
from ..evaluate.general_skills import local_tasks
from ..rewards import REWARD_TYPES, RewardSpec, known_types
from ..stages.dpo.settings import DPO
from ..stages.evaluate.settings import Evaluate
from ..stages.grpo.settings import GRPO, GRPOArgs
from ..stages.kto.settings import KTO
from ..stages.orpo.settings import ORPO
from ..stages.reward_model.settings import RewardModel, RewardModelArgs
from ..stages.sft.settings import SFT
from ..text.matchers import MATCHERS
from ..train.preference import PreferenceArgs
from ..train.stage import TrainerStage
from .objectives import DEFAULT, NAMES, Objective

log = logging.getLogger("dragon_dagster")


# Retraining from chat feedback continues from the deployed model with lighter settings than the pipeline's.
class FeedbackSFTArgs(TrainArgs):
    epochs: float = Field(1, gt=0, description="Passes over the feedback conversations.")


class FeedbackSFT(SFT):
    kind: Literal["sft"] = "sft"
    name: Literal["sft_on_feedback"] = Field("sft_on_feedback", description="The asset's name (fixed).")
    dataset: Literal["feedback_sft_dataset"] = Field(
        "feedback_sft_dataset", description="Liked and edited replies from the feedback store (fixed)."
    )
    args: FeedbackSFTArgs = Field(default_factory=FeedbackSFTArgs, description="Trainer arguments.")
    n_samples: int = Field(3, ge=0, description="Held-out prompts answered after training.")
    max_new_tokens: int = Field(64, gt=0, description="Length limit of sample replies.")


class FeedbackPairArgs(PreferenceArgs):
    epochs: float = Field(1, gt=0, description="Passes over the feedback pairs.")


class FeedbackDPO(DPO):
    kind: Literal["dpo"] = "dpo"
    name: Literal["dpo_on_feedback"] = Field("dpo_on_feedback", description="The asset's name (fixed).")
    dataset: Literal["feedback_pairs"] = Field("feedback_pairs", description="Pairs from the feedback store (fixed).")
    args: FeedbackPairArgs = Field(default_factory=FeedbackPairArgs, description="Trainer arguments.")
    n_samples: int = Field(3, ge=0, description="Held-out pairs answered after training.")
    max_new_tokens: int = Field(64, gt=0, description="Length limit of sample replies.")


class FeedbackORPO(ORPO):
    kind: Literal["orpo"]
    name: Literal["dpo_on_feedback"] = Field("dpo_on_feedback", description="The asset's name (fixed).")
    dataset: Literal["feedback_pairs"] = Field("feedback_pairs", description="Pairs from the feedback store (fixed).")
    args: FeedbackPairArgs = Field(default_factory=FeedbackPairArgs, description="Trainer arguments.")
    n_samples: int = Field(3, ge=0, description="Held-out pairs answered after training.")
    max_new_tokens: int = Field(64, gt=0, description="Length limit of sample replies.")


def _pair_kind(value: Any) -> str:
    """The pairs objective's kind: dpo unless it says orpo (`method: orpo` from before the kinds were split)."""
    if isinstance(value, dict):
        return value.get("kind") or value.get("method") or "dpo"
    return getattr(value, "kind", "dpo")


def _renamed_method(value: Any) -> Any:
    """`feedback.dpo.method: orpo` (before the preference kinds were split) reads as `kind: orpo`."""
    if isinstance(value, dict) and "method" in value:
        value = dict(value)
        method = value.pop("method")
        log.warning("feedback.dpo: `method: %s` is now `kind: %s`; reading it as that", method, method)
        value.setdefault("kind", method)
    return value


FeedbackPairs = Annotated[
    Annotated[FeedbackDPO, Tag("dpo")] | Annotated[FeedbackORPO, Tag("orpo")],
    Discriminator(_pair_kind),
    BeforeValidator(_renamed_method),
]


class FeedbackKTOArgs(PreferenceArgs):
    epochs: float = Field(1, gt=0, description="Passes over the feedback ratings.")


class FeedbackKTO(KTO):
    kind: Literal["kto"] = "kto"
    name: Literal["kto_on_feedback"] = Field("kto_on_feedback", description="The asset's name (fixed).")
    dataset: Literal["feedback_ratings"] = Field(
        "feedback_ratings", description="Ratings without a pair from the feedback store (fixed)."
    )
    args: FeedbackKTOArgs = Field(default_factory=FeedbackKTOArgs, description="Trainer arguments.")
    n_samples: int = Field(3, ge=0, description="Held-out ratings answered after training.")
    max_new_tokens: int = Field(64, gt=0, description="Length limit of sample replies.")


class FeedbackRewardModelArgs(RewardModelArgs):
    epochs: float = Field(2, gt=0, description="Passes over the feedback pairs.")


class FeedbackRewardModel(RewardModel):
    kind: Literal["reward_model"] = "reward_model"
    name: Literal["feedback_reward_model"] = Field("feedback_reward_model", description="The asset's name (fixed).")
    dataset: Literal["feedback_pairs"] = Field("feedback_pairs", description="Pairs from the feedback store (fixed).")
    args: FeedbackRewardModelArgs = Field(default_factory=FeedbackRewardModelArgs, description="Trainer arguments.")
    n_samples: int = Field(3, ge=0, description="Held-out pairs scored after training (samples.jsonl).")
    min_accuracy: float = Field(
        0.5, ge=0, le=1, description="The held_out_accuracy check warns below this share of held-out pairs."
    )


class FeedbackGRPOArgs(GRPOArgs):
    max_steps: int | None = Field(20, gt=0, description="GRPO steps on the feedback prompts.")


def _feedback_rewards() -> list[dict[str, Any]]:
    return [{"type": "reward_model", "stage": "feedback_reward_model", "name": "taste_model"}]


def _feedback_guard() -> list[dict[str, Any]]:
    # A reward model's best-known blind spot: it likes longer replies; a reply that grows past this is the policy
    # climbing the model rather than the taste it learned.
    return [{"type": "length", "max_chars": 600, "name": "not_rambling"}]


class FeedbackGRPO(GRPO):
    kind: Literal["grpo"] = "grpo"
    name: Literal["rlhf_on_feedback"] = Field("rlhf_on_feedback", description="The asset's name (fixed).")
    dataset: Literal["feedback_prompts"] = Field(
        "feedback_prompts", description="The prompts people rated replies to (fixed)."
    )
    rewards: list[RewardSpec] = Field(
        default_factory=_feedback_rewards,
        validate_default=True,
        min_length=1,
        description="What the fresh replies are scored by: the feedback reward model (its stage is "
        "feedback_reward_model), plus any verifiable reward by weight.",
    )
    guard: list[RewardSpec] = Field(
        default_factory=_feedback_guard,
        validate_default=True,
        description="Rewards never trained on, scored on held-out feedback prompts before and after: by default a "
        "length bound (reward models favour longer replies, the best-known way a policy games one).",
    )
    args: FeedbackGRPOArgs = Field(default_factory=FeedbackGRPOArgs, description="Trainer arguments.")
    n_samples: int = Field(3, ge=0, description="Held-out prompts answered before and after training.")
    max_new_tokens: int = Field(64, gt=0, description="Rollout length and the length limit of sample replies.")
    max_eval_prompts: int = Field(16, ge=0, description="Held-out feedback prompts scored before and after.")

    @model_validator(mode="after")
    def _scored_by_the_feedback_model(self):
        stages = set(self.scorers())
        if stages - {"feedback_reward_model"}:
            raise ValueError(
                f"feedback.rlhf: a reward_model reward can name only feedback_reward_model (the model trained on "
                f"the feedback pairs), not {sorted(stages - {'feedback_reward_model'})}"
            )
        return self


class FeedbackEvaluate(Evaluate):
    kind: Literal["evaluate"] = "evaluate"
    name: Literal["retrained_report"] = Field("retrained_report", description="The asset's name (fixed).")
    dataset: str = Field(
        "", description="Held-out rows to compare on; default: the pipeline's first dataset of chat rows."
    )
    n_judge: int = Field(0, ge=0, description="Held-out prompts judged pairwise (0: none).")
    max_eval_rows: int | None = Field(
        200,
        gt=0,
        description="Held-out rows scored (a seeded sample; null: every row), and at most this many of the held-out "
        "rated replies and of the pairs the promotion gate decides on: higher than a report's 50, since the gate's "
        "paired test decides on these rows and loses power with fewer.",
    )
    skills: list[str] = Field(
        default_factory=local_tasks,
        description="General-skill tasks (lm-evaluation-harness) run on the starting and the retrained model; the "
        "promotion gate refuses a retraining that loses more than gate.skills_tolerance on one. Default: the "
        "bundled suite (local data, no hub); any lm-eval task name where its data is reachable; empty: none.",
    )
    skills_limit: int | None = Field(
        None,
        gt=0,
        description="At most this many items of each skills task (null: all of them; the bundled tasks have 32 "
        "each, so one item is 0.03 of a score).",
    )


# the most a task metric may fall (eval_loss: rise) before the gate calls the retrained model worse
TASK_TOLERANCE = {"eval_loss": 0.02, "token_f1": 0.02, "exact": 0.0, "contains": 0.0, "numeric": 0.0}


GATE_METRICS = ("reward", "pair_accuracy", "liked_share")


class LiveGate(Settings):
    """The gate's last step, on live traffic: a retrained model that passed on held-out feedback stays the
    challenger (`dragon serve --challenger-share` sends it a share of the users) until it and the champion each
    have min_ratings ratings over HTTP; then a one-sided Fisher exact test of "the challenger is liked less" on
    those ratings decides, once: promoted unless p < alpha (engine/evaluate/live_rates.py)."""

    min_ratings: int = Field(
        20,
        ge=1,
        description="Ratings each version needs (counted from when the challenger passed the held-out gate) "
        "before the test runs; the test uses each version's first this many.",
    )
    alpha: float = Field(
        0.05,
        gt=0,
        lt=1,
        description="The test's level: the challenger is refused when the one-sided p-value of 'liked less than "
        "the champion' is below it.",
    )


class Gate(Settings):
    """The promotion gate of a retraining: better on held-out feedback, not worse on the pipeline's task."""

    metric: Literal["reward", "pair_accuracy", "liked_share"] = Field(
        "reward",
        description="What must rise on the held-out feedback (conversations never trained on): reward "
        "(the mean implicit reward: per-token log-probability of liked replies up and of "
        "disliked ones down, retrained against the starting model), pair_accuracy (share of "
        "held-out pairs whose chosen reply is the likelier), or liked_share (share of fresh "
        "replies to held-out feedback prompts that `taste` likes).",
    )
    min_gain: float | None = Field(
        0.0,
        allow_inf_nan=False,
        description="The retrained model must beat the starting model on `metric` by more "
        "than this; null: only 'not worse' (no gain asked for).",
    )
    task_tolerance: dict[str, float] = Field(
        default_factory=lambda: dict(TASK_TOLERANCE),
        description="How far each task metric of the pipeline's held-out rows may fall (eval_loss: rise) before "
        "the retrained model counts as worse; the values given replace those defaults one by one.",
    )
    taste: list[RewardSpec] | None = Field(
        None,
        description="liked_share: rewards scoring a reply (the GRPO reward types, e.g. a custom file); a "
        "reply is liked when their weighted sum is at least liked_at.",
    )
    liked_at: float = Field(1.0, allow_inf_nan=False, description="liked_share: the least score of a liked reply.")
    held_out_frac: float = Field(
        0.2, ge=0, lt=1, description="Share of feedback conversations held out of training, to measure the gain on."
    )
    # 0.1 is three items of a bundled task's 32: one or two flip between a model and a lightly retrained one on
    # tasks a small model half knows, which is not forgetting
    skills_tolerance: float = Field(
        0.1,
        ge=0,
        le=1,
        description="How far the retrained model's score on a general-skill task (feedback.evaluate.skills) may "
        "fall below the starting model's before the gate refuses it, naming the task.",
    )

    live: LiveGate | None = Field(
        None,
        description="Also require live ratings ({min_ratings, alpha}): passing promotes no one at once; the "
        "challenger is promoted by the live gate sensor once it and the champion each have min_ratings ratings "
        "from `dragon serve` and the challenger is not shown liked less. Null: promote on held-out feedback alone.",
    )

    _known_taste_types = known_types("taste", "gate.taste")

    @model_validator(mode="after")
    def _taste_for_liked_share(self):
        if self.metric == "liked_share" and not self.taste:
            raise ValueError("gate metric liked_share needs `taste`: the rewards that say which replies are liked")
        for i, reward in enumerate(self.taste or []):
            if reward.needs_reference:
                raise ValueError(
                    f"gate.taste[{i}]: {reward.type} compares with a reference answer, which feedback prompts do not "
                    f"have; use {', '.join(t for t, model in REWARD_TYPES.items() if not model.needs_reference)}"
                )
        return self

    @model_validator(mode="after")
    def _tolerances(self):
        unknown = sorted(set(self.task_tolerance) - set(TASK_TOLERANCE) - _task_metric_names())
        if unknown:
            raise ValueError(
                f"gate.task_tolerance: unknown metric(s) {unknown}; known: eval_loss, "
                + ", ".join(sorted(_task_metric_names()))
            )
        self.task_tolerance = {**TASK_TOLERANCE, **self.task_tolerance}
        if self.min_gain is not None and self.held_out_frac == 0:
            raise ValueError(
                "gate.min_gain asks for a gain on held-out feedback, but held_out_frac is 0: hold some "
                "out, or set min_gain: null"
            )
        return self


def skill_falls(skills: dict | None, tolerance: float) -> dict[str, str]:
    """The general-skill tasks a retraining lost more than `tolerance` on: {task: why, with its figures}; {} when
    the report ran none."""
    return {
        c["task"]: f"general skill {c['task']} fell {c['base']:.2f} -> {c['merged']:.2f} ({c['metric']}), beyond "
        f"skills_tolerance {tolerance:g}"
        for c in (skills or {}).get("changes", [])
        if c["change"] < -tolerance - 1e-9  # a float's last bit is not a fall
    }


def _task_metric_names() -> set[str]:
    return set(MATCHERS)


class FeedbackSource(Settings):
    """Where the feedback records come from: the chat's feedback store (the default), or the human assessments
    on an MLflow experiment's traces (an assistant that is not this project's chat, traced by MLflow)."""

    mlflow_experiment: str | None = Field(
        None,
        min_length=1,
        description="Read the records from this MLflow experiment's traces instead of the feedback store: a "
        "feedback assessment named `thumbs` (True/False) is an up/down on the trace's reply, an expectation named "
        "`edited_reply` an edit, HUMAN sources only (engine/data/trace_feedback.py).",
    )
    tracking_uri: str | None = Field(
        None, description="The MLflow server holding that experiment; default the pipeline's tracking URI."
    )
    thumbs: str = Field("thumbs", min_length=1, description="The name of the rating feedback assessment.")
    edited: str = Field("edited_reply", min_length=1, description="The name of the edit expectation.")

    @model_validator(mode="after")
    def _experiment_for_uri(self):
        if self.tracking_uri and not self.mlflow_experiment:
            raise ValueError("feedback.source.tracking_uri goes with mlflow_experiment (the store needs none)")
        return self


class Feedback(Settings):
    """Retraining from chat feedback (`dragon chat`, `dragon chat-ui`), continuing from the deployed model."""

    source: FeedbackSource = Field(
        default_factory=FeedbackSource,
        description="Where the records come from: the feedback store (default) or {mlflow_experiment: NAME}.",
    )
    min_new_records: int = Field(20, ge=1, description="The sensor requests retraining at this many new records.")
    pii: PiiMode = Field(
        "warn",
        description="What to do with personal data people typed into the chat or the replies hold (e-mail "
        "addresses, phone numbers, card numbers that pass the Luhn checksum, IP addresses; names are not "
        "detected), looked for in every feedback record a retraining uses. warn, the default: counts and masked "
        "examples on each feedback dataset, and its no_personal_data check warns. redact: each piece replaced by a "
        "placeholder such as <EMAIL_ADDRESS> in every row made from the records. block: the check fails as an "
        "ERROR naming the records, which stops the retraining.",
    )
    cron: str = Field("0 2 * * *", description="The schedule retrains only when there is new feedback.")
    objectives: list[Literal[NAMES]] = Field(
        default_factory=lambda: list(DEFAULT),
        min_length=1,
        description="What the retraining runs, always in the order sft, dpo, kto, rlhf: sft (liked and edited "
        "replies), dpo (pairs: an edit against its original, a liked against a disliked reply to the same "
        "turns), kto (liked or disliked replies without a pair), rlhf (a reward model trained on the pairs, then "
        "GRPO on the rated prompts against it; off unless listed). Each is skipped when it has no records.",
    )
    sft: FeedbackSFT = Field(default_factory=FeedbackSFT, description="SFT on liked and edited replies.")
    dpo: FeedbackPairs = Field(
        default_factory=FeedbackDPO, description="DPO (or kind: orpo) on pairs, after the feedback SFT."
    )
    kto: FeedbackKTO = Field(default_factory=FeedbackKTO, description="KTO on ratings without a pair.")
    reward_model: FeedbackRewardModel = Field(
        default_factory=FeedbackRewardModel,
        description="rlhf: the reward model trained on the feedback pairs (from the deployed model).",
    )
    rlhf: FeedbackGRPO = Field(
        default_factory=FeedbackGRPO,
        description="rlhf: GRPO on the rated prompts against the reward model, last in the chain.",
    )
    evaluate: FeedbackEvaluate = Field(
        default_factory=FeedbackEvaluate, description="The report the promotion gate reads."
    )
    gate: Gate = Field(default_factory=Gate, description="When a retrained model becomes the champion.")

    @model_validator(mode="after")
    def _learned_taste_is_rlhfs(self):
        """A reward_model taste scores with the model the rlhf objective trains: it must be on, and named."""
        named = {r.stage for r in self.gate.taste or [] if r.type == "reward_model"}
        if named - {self.reward_model.name}:
            raise ValueError(
                f"gate.taste: a reward_model reward can name only {self.reward_model.name} (the model the rlhf "
                f"objective trains on the feedback pairs), not {sorted(named - {self.reward_model.name})}"
            )
        if named and "rlhf" not in self.objectives:
            raise ValueError(
                "gate.taste scores with the feedback reward model, which only the rlhf objective trains: add rlhf "
                "to feedback.objectives"
            )
        return self

    def trained_by(self, objective: Objective) -> list[TrainerStage]:
        """The stages that train an objective, in order: the last continues the chain of adapters."""
        return [getattr(self, field) for field in objective.stages]
