"""A pipeline: a model, source datasets and an ordered list of stages, as its YAML (a component's
`attributes:`) gives them.

    name: support
    model: smollm2-135m
    datasets:
      tickets: {path: example:tickets.csv}
    stages:
      - {name: sft_dataset, kind: chat_dataset, source: tickets, prompt: "{subject}\\n\\n{body}", response: reply}
      - {name: sft_adapter, kind: sft, dataset: sft_dataset, args: {epochs: 3}}
      - {name: merged_model, kind: merge}
      - {name: evaluation_report, kind: evaluate, dataset: sft_dataset}
      - {name: gguf_export, kind: export}
    profiles:
      quick: {sft_adapter: {args: {max_steps: 20}}}

Training stages chain in order (each continues from the one before, folding it in); a merge takes the
training stages before it; an evaluation measures the merge before it; an export writes the merge before it
(or the one it names) as GGUF files, after that merge's evaluation when there is one. Each stage's settings are
its kind's model in stages.py; a profile is a named overlay of per-run settings, validated by the same models.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, PrivateAttr, ValidationError, model_validator

from . import stages as s
from .registry import KINDS, AnyStage, overlay, tunable_fields

TEMPLATED = re.compile(r"\{[^{}]+\}")  # a system prompt filled from each row's columns: no single prompt
EXAMPLE_DIR = Path(__file__).resolve().parents[2] / "example_data"


class PipelineError(ValueError):
    """A pipeline's YAML is malformed; the message names the file, the line and the field."""


class DatasetSource(s.Settings):
    path: str = Field(
        description="A file or `datasets` directory, relative to the pipeline's folder; "
        "'example:NAME' reads a bundled example file."
    )
    format: Literal["csv", "jsonl", "json", "parquet"] | None = Field(
        None, description="File format when the extension does not tell."
    )


# Retraining from chat feedback continues from the deployed model with lighter settings than the pipeline's.
class FeedbackSFTArgs(s.TrainArgs):
    epochs: float = Field(1, gt=0, description="Passes over the feedback conversations.")


class FeedbackSFT(s.SFT):
    kind: Literal["sft"] = "sft"
    name: Literal["feedback_sft_adapter"] = Field("feedback_sft_adapter", description="The asset's name (fixed).")
    dataset: Literal["feedback_sft_dataset"] = Field(
        "feedback_sft_dataset", description="Liked and edited replies from the feedback store (fixed)."
    )
    args: FeedbackSFTArgs = Field(default_factory=FeedbackSFTArgs, description="Trainer arguments.")
    n_samples: int = Field(3, ge=0, description="Held-out prompts answered after training.")
    max_new_tokens: int = Field(64, gt=0, description="Length limit of sample replies.")


class FeedbackDPOArgs(s.PreferenceArgs):
    epochs: float = Field(1, gt=0, description="Passes over the feedback pairs.")


class FeedbackDPO(s.Preference):
    kind: Literal["preference"] = "preference"
    method: Literal["dpo", "orpo"] = Field("dpo", description="dpo or orpo (kto runs on the unpaired ratings).")
    name: Literal["feedback_dpo_adapter"] = Field("feedback_dpo_adapter", description="The asset's name (fixed).")
    dataset: Literal["feedback_pairs"] = Field("feedback_pairs", description="Pairs from the feedback store (fixed).")
    args: FeedbackDPOArgs = Field(default_factory=FeedbackDPOArgs, description="Trainer arguments.")
    n_samples: int = Field(3, ge=0, description="Held-out pairs answered after training.")
    max_new_tokens: int = Field(64, gt=0, description="Length limit of sample replies.")


class FeedbackKTOArgs(s.PreferenceArgs):
    epochs: float = Field(1, gt=0, description="Passes over the feedback ratings.")


class FeedbackKTO(s.Preference):
    kind: Literal["preference"] = "preference"
    name: Literal["feedback_kto_adapter"] = Field("feedback_kto_adapter", description="The asset's name (fixed).")
    dataset: Literal["feedback_ratings"] = Field(
        "feedback_ratings", description="Ratings without a pair from the feedback store (fixed)."
    )
    method: Literal["kto"] = Field("kto", description="kto (fixed): unpaired liked/disliked replies.")
    args: FeedbackKTOArgs = Field(default_factory=FeedbackKTOArgs, description="Trainer arguments.")
    n_samples: int = Field(3, ge=0, description="Held-out ratings answered after training.")
    max_new_tokens: int = Field(64, gt=0, description="Length limit of sample replies.")


class FeedbackEvaluate(s.Evaluate):
    kind: Literal["evaluate"] = "evaluate"
    name: Literal["retrained_report"] = Field("retrained_report", description="The asset's name (fixed).")
    dataset: str = Field("", description="Held-out rows to compare on; default: the pipeline's first chat_dataset.")
    n_judge: int = Field(0, ge=0, description="Held-out prompts judged pairwise (0: none).")


# the most a task metric may fall (eval_loss: rise) before the gate calls the retrained model worse
TASK_TOLERANCE = {"eval_loss": 0.02, "token_f1": 0.02, "exact": 0.0, "contains": 0.0, "numeric": 0.0}
GATE_METRICS = ("reward", "pair_accuracy", "liked_share")


class Gate(s.Settings):
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
    taste: list[dict[str, Any]] | None = Field(
        None,
        description="liked_share: rewards scoring a reply (the GRPO reward types, e.g. a custom file); a "
        "reply is liked when their weighted sum is at least liked_at.",
    )
    liked_at: float = Field(1.0, allow_inf_nan=False, description="liked_share: the least score of a liked reply.")
    held_out_frac: float = Field(
        0.2, ge=0, lt=1, description="Share of feedback conversations held out of training, to measure the gain on."
    )

    @model_validator(mode="after")
    def _taste_for_liked_share(self):
        if self.metric == "liked_share" and not self.taste:
            raise ValueError("gate metric liked_share needs `taste`: the rewards that say which replies are liked")
        if self.taste:
            from ..rewards import NEEDS_REFERENCE, OPTIONS

            for i, reward in enumerate(self.taste):
                if reward.get("type") not in OPTIONS:
                    raise ValueError(
                        f"gate.taste[{i}]: unknown reward type {reward.get('type')!r}; known: {', '.join(OPTIONS)}"
                    )
                if reward["type"] in NEEDS_REFERENCE:
                    raise ValueError(
                        f"gate.taste[{i}]: {reward['type']} compares with a reference answer, which "
                        "feedback prompts do not have; use regex, length, keyword, json, command or "
                        "custom"
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


def _task_metric_names() -> set[str]:
    from ..evaluate.metrics import METRICS

    return set(METRICS)


OBJECTIVES = ("sft", "dpo", "kto")


class Feedback(s.Settings):
    """Retraining from chat feedback (`dragon chat`, `dragon chat-ui`), continuing from the deployed model."""

    min_new_records: int = Field(20, ge=1, description="The sensor requests retraining at this many new records.")
    cron: str = Field("0 2 * * *", description="The schedule retrains only when there is new feedback.")
    objectives: list[Literal["sft", "dpo", "kto"]] = Field(
        default_factory=lambda: list(OBJECTIVES),
        min_length=1,
        description="What the retraining runs, always in the order sft, dpo, kto: sft (liked and edited replies), "
        "dpo (pairs: an edit against its original, a liked against a disliked reply to the same "
        "turns), kto (liked or disliked replies without a pair). Each is skipped when it has no records.",
    )
    sft: FeedbackSFT = Field(default_factory=FeedbackSFT, description="SFT on liked and edited replies.")
    dpo: FeedbackDPO = Field(default_factory=FeedbackDPO, description="DPO on pairs, after the feedback SFT.")
    kto: FeedbackKTO = Field(default_factory=FeedbackKTO, description="KTO on ratings without a pair, last.")
    evaluate: FeedbackEvaluate = Field(
        default_factory=FeedbackEvaluate, description="The report the promotion gate reads."
    )
    gate: Gate = Field(default_factory=Gate, description="When a retrained model becomes the champion.")


class Pipeline(s.Settings):
    """A post-training pipeline: the attributes of a `dragon_dagster.PostTrainingPipeline` component."""

    name: str = Field(pattern=s.NAME_PATTERN, description="Prefix of every asset key; lower-case, digits, _.")
    description: str = Field("", description="Shown on the pipeline's job.")
    model: str = Field(
        "smollm2-135m",
        description="The base model: a preset (see `dragon presets`), a Hugging Face id or a local directory.",
    )
    datasets: dict[str, DatasetSource] = Field(default_factory=dict, description="Source files, by name.")
    stages: list[AnyStage] = Field(min_length=1, description="The stages in order; each names its kind.")
    profiles: dict[str, dict[str, dict[str, Any]]] = Field(
        default_factory=dict, description="Named per-run overlays: {profile: {stage: {setting: value}}}."
    )
    feedback: Feedback | None = Field(None, description="Retraining from chat feedback.")

    _upstream: dict[str, list[str]] = PrivateAttr(default_factory=dict)
    _source_file: str | None = PrivateAttr(None)

    @classmethod
    def model_json_schema(cls, *args, **kwargs) -> dict[str, Any]:
        """Pydantic's schema, reshaped for JSON-schema validators (`dg check yaml`, editors): a stage is checked
        against its own kind's schema (if/then on kind), so an error names the field, not just the list item;
        and a number may be written as `2e-4`, which YAML 1.1 reads as a string."""
        schema = super().model_json_schema(*args, **kwargs)
        stages = schema["properties"]["stages"]
        mapping = stages["items"]["discriminator"]["mapping"]
        stages["items"] = {
            "type": "object",
            "required": ["kind"],
            "properties": {"kind": {"enum": list(mapping), "description": "The stage's kind."}},
            "allOf": [
                {"if": {"properties": {"kind": {"const": kind}}, "required": ["kind"]}, "then": {"$ref": ref}}
                for kind, ref in mapping.items()
            ],
        }
        _numbers_as_strings(schema)
        return schema

    @model_validator(mode="after")
    def _wire(self):
        """Each stage's inputs: what it names, plus the training stage or merge it continues from."""
        seen, last_training, last_merge = set(self.datasets), None, None
        for stage in self.stages:
            if stage.name in seen:
                raise ValueError(f"stage name {stage.name!r} is used twice")
            for ref in stage.reads():
                if ref not in seen:
                    raise ValueError(
                        f"stage {stage.name!r} names {ref!r}, which is not an earlier dataset or "
                        f"stage; known so far: {sorted(seen)}"
                    )
            upstream = stage.reads()
            role = KINDS[stage.kind].role
            if role == "training" or stage.kind == "preference_pairs":
                if last_training is None and stage.kind in ("preference", "preference_pairs"):
                    raise ValueError(
                        f"stage {stage.name!r} ({stage.kind}) has no training stage before it to "
                        "continue from; put an sft stage first"
                    )
                upstream += [last_training] if last_training else []
                if role == "training":
                    last_training = stage.name
            elif role == "merge":
                if last_training is None:
                    raise ValueError(f"merge stage {stage.name!r} has no training stage before it")
                upstream, last_merge = [last_training], stage.name
            elif role == "evaluate":
                if last_merge is None:
                    raise ValueError(f"evaluate stage {stage.name!r} has no merge stage before it")
                upstream = [last_merge, *upstream]
            elif role == "export":
                upstream = [self._export_source(stage, last_merge)]
            self._upstream[stage.name] = upstream
            seen.add(stage.name)
        for stage in self.stages:  # an export also waits for the report on its model, wherever it is listed
            if KINDS[stage.kind].role == "export":
                self._upstream[stage.name] += [
                    s.name
                    for s in self.stages
                    if KINDS[s.kind].role == "evaluate" and self._upstream[s.name][0] == self._upstream[stage.name][0]
                ][:1]
        self._check_preference_data()
        self._check_profiles()
        self._check_feedback()
        return self

    def _check_preference_data(self) -> None:
        """DPO and ORPO need pairs; KTO takes rated replies or pairs (split into a liked and a disliked reply)."""
        names = {st.name for st in self.stages}
        for stage in self.stages:
            if stage.kind != "preference":
                continue
            if stage.dataset not in names:
                raise ValueError(
                    f"stage {stage.name!r} names {stage.dataset!r}, a source file: map it with a "
                    f"{'rated_dataset or ' if stage.method == 'kto' else ''}pairs_dataset first"
                )
            data = self.stage(stage.dataset).kind
            paired = data in ("pairs_dataset", "preference_pairs")
            if stage.method == "kto" and not (paired or data == "rated_dataset"):
                raise ValueError(
                    f"stage {stage.name!r} (kto) trains on rated replies: its dataset "
                    f"{stage.dataset!r} is a {data}; use a rated_dataset or a pairs_dataset"
                )
            if stage.method != "kto" and not paired:
                raise ValueError(
                    f"stage {stage.name!r} ({stage.method}) trains on pairs: its dataset "
                    f"{stage.dataset!r} is a {data}; use a pairs_dataset or preference_pairs"
                    + (", or method: kto for rated replies" if data == "rated_dataset" else "")
                )

    def _export_source(self, stage: s.Stage, last_merge: str | None) -> str:
        """The merge stage an export reads: the one it names (checked to be a merge), else the last before it."""
        if stage.model is None:
            if last_merge is None:
                raise ValueError(f"export stage {stage.name!r} has no merge stage before it to export")
            return last_merge
        named = self.stage(stage.model)
        if KINDS[named.kind].role != "merge":
            raise ValueError(
                f"export stage {stage.name!r}: model {stage.model!r} is a {named.kind} stage, not a "
                "merge stage; name the merge stage whose model to export"
            )
        return stage.model

    def _check_profiles(self) -> None:
        for profile, overrides in self.profiles.items():
            for stage_name, values in overrides.items():
                if stage_name not in self._upstream:
                    raise ValueError(f"profile {profile!r} names {stage_name!r}, which is not a stage")
                stage = self.stage(stage_name)
                fixed = sorted(set(values) - set(tunable_fields(type(stage))))
                if fixed:
                    raise ValueError(
                        f"profile {profile!r}, stage {stage_name!r}: {fixed} cannot change per run; "
                        f"per-run settings: {sorted(tunable_fields(type(stage)))}"
                    )
                try:
                    type(stage).model_validate(overlay(stage.model_dump(), values))
                except ValidationError as exc:
                    raise ValueError(f"profile {profile!r}, stage {stage_name!r}: {describe(exc)}") from None

    def _check_feedback(self) -> None:
        if self.feedback is None:
            return
        chat = self.first("chat_dataset")
        if self.first("merge") is None or chat is None:
            raise ValueError(
                "feedback retraining needs a merge stage (the deployed model) and a chat_dataset "
                "(held-out rows to compare on)"
            )
        if not self.feedback.evaluate.dataset:
            self.feedback.evaluate.dataset = chat.name

    # ---- reading it

    def first(self, kind: str) -> s.Stage | None:
        return next((st for st in self.stages if st.kind == kind), None)

    def stage(self, name: str) -> s.Stage:
        return next(st for st in self.stages if st.name == name)

    def system_prompt(self, before: str | None = None) -> str | None:
        """The fixed system prompt of the chat dataset the first training stage (before stage `before`, default
        anywhere) trained on: what the model learned to answer after, so chat and feedback should send it too.
        None when that dataset has none, or fills it per row from a template such as '{persona}'."""
        names = [st.name for st in self.stages]
        stages = self.stages[: names.index(before)] if before else self.stages
        training = [st for st in stages if KINDS[st.kind].role == "training"]
        if not training or training[0].dataset not in names:
            return None
        dataset = self.stage(training[0].dataset)
        system = dataset.system if isinstance(dataset, s.ChatDataset) else None
        return system if system and not TEMPLATED.search(system) else None

    def upstream(self, name: str) -> list[str]:
        """Asset names the stage reads, in the order its asset takes them."""
        return self._upstream[name]

    def profile(self, name: str) -> dict[str, dict]:
        if name not in self.profiles:
            raise PipelineError(f"pipeline {self.name!r} has no profile {name!r}; it has {sorted(self.profiles)}")
        return self.profiles[name]

    @property
    def source_file(self) -> str | None:
        return self._source_file

    def located(self, source_file: str | Path | None) -> Pipeline:
        """This pipeline with its file paths resolved against the folder of the YAML that declared it."""
        base = Path(source_file).parent if source_file else None
        datasets = {n: d.model_copy(update={"path": str(resolve_path(d.path, base))}) for n, d in self.datasets.items()}
        stages = [
            st.model_copy(update={"path": str(resolve_path(st.path, base))}) if getattr(st, "path", None) else st
            for st in self.stages
        ]
        out = self.model_copy(update={"datasets": datasets, "stages": stages})
        out._source_file = str(source_file) if source_file else None
        return out


NUMBER_TEXT = r"^\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*$"


def _numbers_as_strings(node: Any) -> None:
    """Let every number in a schema also be a string that reads as one, as pydantic's lax mode accepts it."""
    if isinstance(node, list):
        for value in node:
            _numbers_as_strings(value)
    elif isinstance(node, dict):
        for value in node.values():
            _numbers_as_strings(value)
        if node.get("type") == "number":
            node.pop("type")
            bounds = {
                k: node.pop(k) for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum") if k in node
            }
            node["anyOf"] = [{"type": "number", **bounds}, {"type": "string", "pattern": NUMBER_TEXT}]


def resolve_path(path: str, base: Path | None) -> Path:
    if path.startswith("example:"):
        return EXAMPLE_DIR / path.split(":", 1)[1]
    candidate = Path(path).expanduser()
    if not candidate.is_absolute() and base is not None:
        candidate = base / candidate
    return candidate


def describe(exc: ValidationError, lines: dict[tuple, int] | None = None) -> str:
    """Pydantic's errors as 'stages[1].args.learning_rate (line 12): Input should be ...', one per line."""
    out = []
    for error in exc.errors():
        loc = [p for p in error["loc"] if not (isinstance(p, str) and p in KINDS)]  # drop the union's tag
        field = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".") or "pipeline"
        line = _line_of(lines or {}, tuple(loc))
        got = (
            f" (got {error['input']!r})"
            if error["type"] not in ("missing", "extra_forbidden") and not isinstance(error.get("input"), (dict, list))
            else ""
        )
        message = "unknown field" if error["type"] == "extra_forbidden" else error["msg"]
        out.append(f"{field}{f' (line {line})' if line else ''}: {message}{got}")
    return "; ".join(out)


def _line_of(lines: dict[tuple, int], loc: tuple) -> int | None:
    while loc and loc not in lines:
        loc = loc[:-1]
    return lines.get(loc)


def _node_lines(node, path=()) -> dict[tuple, int]:
    """Line of every mapping key and list item in a YAML node tree, by its path."""
    found = {path: node.start_mark.line + 1}
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            found.update(_node_lines(value, (*path, key.value)))
            found[(*path, key.value)] = key.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            found.update(_node_lines(item, (*path, i)))
    return found


def parse(data: Any, source_file: str | Path | None = None, lines: dict[tuple, int] | None = None) -> Pipeline:
    where = str(source_file or "pipeline")
    try:
        pipeline = Pipeline.model_validate(data)
    except ValidationError as exc:
        raise PipelineError(f"{where}: {describe(exc, lines)}") from None
    return pipeline.located(source_file)


def load(path: str | Path) -> Pipeline:
    """A pipeline from a YAML file: a component's defs.yaml (its `attributes:`) or a bare pipeline mapping."""
    path = Path(path)
    try:
        text = path.read_text()
        data, root = yaml.safe_load(text), yaml.compose(text)
    except yaml.YAMLError as exc:
        raise PipelineError(f"{path}: not valid YAML: {exc}") from exc
    lines = _node_lines(root) if root is not None else {}
    if isinstance(data, dict) and "attributes" in data and "type" in data:
        data = data["attributes"]
        lines = {k[1:]: v for k, v in lines.items() if k[:1] == ("attributes",)}
    return parse(data, path, lines)
