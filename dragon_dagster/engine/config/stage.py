"""What every stage's settings model has, and the hooks a kind fills in instead of generic code branching on it.

Each kind's model (stages/<kind>/settings.py) is the single source of its defaults, ranges, cross-field checks
and docs: it validates the pipeline YAML (and `dg check yaml`, through the component's JSON schema), shapes the
launchpad config of the stage's asset with its effective values, travels in the worker's job and is read back
there, where the trainer turns it into TRL's config. Like TRL's `GRPOConfig`, each field says what it does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, ClassVar, Literal

from pydantic import AfterValidator, Field

from ..text.matchers import MATCHERS
from .settings import NAME_PATTERN, Settings

# Whether a stage continues from the training stage before it in the pipeline (its adapter folded in first):
# never (a dataset, a merge), optional (SFT and GRPO start from the base model when first), required (DPO needs a
# model to prefer over; preference pairs need a student to sample).
Continues = Literal["never", "optional", "required"]


@dataclass(frozen=True)
class StageInput:
    """Another stage a stage reads besides its dataset and the chain it continues, in a role its kind names (a
    scorer: a reward model that scores its samples; a teacher ...). The Dagster layer makes each one an input of
    the stage's asset (a lineage edge) and hands the step its artifact by role and stage, never by parsing a name."""

    role: str
    stage: str


@dataclass(frozen=True)
class ModelReference:
    """A model a stage names by where it is rather than by stage, in a role its kind names (a teacher ...): a
    registered model (`models:/name@alias`, `models:/name/version`), a preset, a Hugging Face id or a local
    directory. The Dagster step resolves it (a registered model through the tracking store, so the job names the
    exact version) and hands the worker its path by role."""

    role: str
    spec: str


class Stage(Settings):
    """What every stage has: its asset's name and its kind."""

    continues: ClassVar[Continues] = "never"
    # Whether the training stages after this one continue from it and a merge folds it in: a policy's adapter
    # does; a reward model's does not (it scores replies, it is not the model being trained).
    in_chain: ClassVar[bool] = True
    # Whether a reward of type reward_model can name this stage (it trains a model that scores replies).
    scores_replies: ClassVar[bool] = False

    name: str = Field(pattern=NAME_PATTERN, description="The asset's name, unique in the pipeline.")
    kind: str

    def reads(self) -> list[str]:
        """Names of earlier datasets or stages this stage names in its own settings."""
        return []

    def extra_inputs(self) -> list[StageInput]:
        """The stages it reads in a role of its kind's (see StageInput); none by default."""
        return []

    def model_references(self) -> list[ModelReference]:
        """The models it reads by where they are, in a role of its kind's (see ModelReference); none by default."""
        return []

    def continues_chain(self) -> bool:
        """Whether this stage continues from the training stage before it (its class's `continues`, unless a
        setting of the stage says to start from the pipeline's model)."""
        return self.continues != "never"

    def check_inputs(self, stage_of) -> None:
        """Raise ValueError when a stage this one reads cannot serve it (a DPO stage on rated replies, say).
        stage_of(name): the earlier stage of that name, or None for a source dataset."""

    def preflight(self, pipeline) -> list[str]:
        """Problems a run of this stage would meet that the files' headers already show, each naming the stage,
        the file and the column. pipeline: the whole pipeline (its `datasets`, and `stage(name)`)."""
        return []


def known_metrics(names: list[str] | None) -> list[str] | None:
    """Task metric names, each one of text/matchers.py's MATCHERS."""
    unknown = [n for n in names or [] if n not in MATCHERS]
    if unknown:
        raise ValueError(f"unknown metric(s) {unknown}; known: {', '.join(MATCHERS)}")
    if names is not None and not names:
        raise ValueError("metrics: name at least one metric, or leave it out for the defaults")
    return names


def check_pass_k(stage) -> None:
    """A stage that measures pass@k draws at least k samples per prompt (its pass_samples and pass_k)."""
    if stage.pass_samples and stage.pass_k > stage.pass_samples:
        raise ValueError(
            f"{stage.kind} stage {stage.name!r}: pass_k ({stage.pass_k}) is more tries than the pass_samples "
            f"({stage.pass_samples}) drawn per prompt: raise pass_samples or lower pass_k"
        )


METRICS_DOC = (
    "Task metrics of the held-out replies, from exact, contains, token_f1, json_valid, numeric, "
    "length_ratio. Default: exact, contains, token_f1 and length_ratio, plus numeric when most "
    "references are numbers and json_valid when most parse as JSON."
)
MetricNames = Annotated[list[str] | None, AfterValidator(known_metrics)]

__all__ = [
    "Stage",
    "StageInput",
    "ModelReference",
    "Continues",
    "MetricNames",
    "METRICS_DOC",
    "known_metrics",
    "check_pass_k",
]
