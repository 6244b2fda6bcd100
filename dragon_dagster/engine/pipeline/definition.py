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
its kind's model (stages/<kind>/settings.py), found through the catalog; a profile is a named overlay of per-run
settings, validated by the same models.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, SerializeAsAny, ValidationError, field_validator, model_validator

from .. import catalog
from ..config.settings import NAME_PATTERN, Settings, overlay, tunable_fields
from ..config.stage import Stage
from ..tools.declare import Tools
from .errors import describe
from .retraining import Feedback
from .sweeps import Sweep, nested

log = logging.getLogger("dragon_dagster")
EXAMPLE_DIR = Path(__file__).resolve().parents[2] / "example_data"


class PipelineError(ValueError):
    """A pipeline's YAML is malformed; the message names the file, the line and the field."""


class DatasetSource(Settings):
    path: str = Field(
        description="A file or `datasets` directory, relative to the pipeline's folder; "
        "'example:NAME' reads a bundled example file."
    )
    format: Literal["csv", "jsonl", "json", "parquet"] | None = Field(
        None, description="File format when the extension does not tell."
    )


class Pipeline(Settings):
    """A post-training pipeline: the attributes of a `dragon_dagster.PostTrainingPipeline` component."""

    name: str = Field(pattern=NAME_PATTERN, description="Prefix of every asset key; lower-case, digits, _.")
    description: str = Field("", description="Shown on the pipeline's job.")
    model: str = Field(
        "smollm2-135m",
        description="The base model: a preset (see `dragon presets`), a Hugging Face id or a local directory.",
    )
    datasets: dict[str, DatasetSource] = Field(default_factory=dict, description="Source files, by name.")
    stages: list[SerializeAsAny[Stage]] = Field(
        min_length=1, description="The stages in order; each names its kind (the stage kinds reference)."
    )
    profiles: dict[str, dict[str, dict[str, Any]]] = Field(
        default_factory=dict, description="Named per-run overlays: {profile: {stage: {setting: value}}}."
    )
    sweeps: dict[str, Sweep] = Field(
        default_factory=dict,
        description="Named sweeps: settings to try, one run of the pipeline's job per point (`dragon sweep`), "
        "ranked by `dragon compare --sweep`.",
    )
    feedback: Feedback | None = Field(None, description="Retraining from chat feedback.")
    tools: Tools | None = Field(
        None,
        description="Tools the model may call, declared once for the whole pipeline: every conversation is "
        "rendered with them (training, evaluation, chat, export) and a GRPO stage with `tools: true` runs them "
        "in its rollouts. See the conversations and tools page.",
    )

    _upstream: dict[str, list[str]] = PrivateAttr(default_factory=dict)
    _previous: dict[str, str | None] = PrivateAttr(default_factory=dict)
    _source_file: str | None = PrivateAttr(None)

    @classmethod
    def model_json_schema(cls, *args, **kwargs) -> dict[str, Any]:
        """The schema `dg check yaml` and editors validate with: every stage against its own kind's model."""
        from .schema import pipeline_schema

        return pipeline_schema(cls, *args, **kwargs)

    @field_validator("stages", mode="before")
    @classmethod
    def _each_by_its_kind(cls, value: Any) -> Any:
        """Each stage validated by the model its kind names (a kind registered later counts too)."""
        if not isinstance(value, list):
            return value
        return catalog.stage_list().validate_python([catalog.upgraded(item, log.warning) for item in value])

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
            upstream, role = stage.reads(), self.role_of(stage)
            if stage.continues == "required" and last_training is None:
                starters = [
                    k.name
                    for k in catalog.KINDS.values()
                    if k.role == "training" and k.settings.continues != "required"
                ]
                raise ValueError(
                    f"stage {stage.name!r} ({stage.kind}) has no training stage before it to continue from; put a "
                    f"stage of kind {' or '.join(starters)} first"
                )
            if stage.continues_chain() and last_training is not None:
                upstream = upstream + [last_training]
            self._previous[stage.name] = last_training if stage.continues_chain() else None
            if role in ("training", "merge_adapters") and stage.in_chain:  # a combined adapter continues the chain
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
                if not upstream and last_merge is None:
                    raise ValueError(f"export stage {stage.name!r} has no merge stage before it to export")
                upstream = upstream or [last_merge]
            stage.check_inputs(self)
            self._upstream[stage.name] = upstream
            seen.add(stage.name)
        for stage in self.stages:  # an export also waits for the report on its model, wherever it is listed
            if self.role_of(stage) == "export":
                self._upstream[stage.name] += [
                    s.name
                    for s in self.stages
                    if self.role_of(s) == "evaluate" and self._upstream[s.name][0] == self._upstream[stage.name][0]
                ][:1]
        self._check_profiles()
        self._check_sweeps()
        self._check_feedback()
        return self

    def _check_profiles(self) -> None:
        for profile, overrides in self.profiles.items():
            self._check_overrides(f"profile {profile!r}", overrides)

    def _check_overrides(self, label: str, overrides: dict[str, dict[str, Any]]) -> dict[str, Stage]:
        """Per-run overrides {stage: {setting: value}}, as a profile or a sweep's point gives them: each stage
        exists, each setting can change per run, and the values pass the stage's own model. Returns the
        stages as the overrides make them."""
        made = {}
        for stage_name, values in overrides.items():
            if stage_name not in self._upstream:
                raise ValueError(f"{label} names {stage_name!r}, which is not a stage; stages: {list(self._upstream)}")
            stage = self.stage(stage_name)
            fixed = sorted(set(values) - set(tunable_fields(type(stage))))
            if fixed:
                raise ValueError(
                    f"{label}, stage {stage_name!r}: {fixed} cannot change per run; "
                    f"per-run settings: {sorted(tunable_fields(type(stage)))}"
                )
            try:
                made[stage_name] = type(stage).model_validate(overlay(stage.model_dump(), values))
            except ValidationError as exc:
                raise ValueError(f"{label}, stage {stage_name!r}: {describe(exc)}") from None
        return made

    def _check_sweeps(self) -> None:
        """Each sweep's profile and evaluate stage exist, and every value it tries is a valid per-run setting
        (over its profile, as the run will have it)."""
        for name, sweep in self.sweeps.items():
            label = f"sweep {name!r}"
            if not re.fullmatch(NAME_PATTERN, name):
                raise ValueError(f"{label}: a sweep's name is lower-case letters, digits and _")
            if sweep.profile is not None and sweep.profile not in self.profiles:
                raise ValueError(f"{label} names profile {sweep.profile!r}; the profiles are {sorted(self.profiles)}")
            evaluations = [s.name for s in self.stages if self.role_of(s) == "evaluate"]
            if sweep.stage is not None and sweep.stage not in evaluations:
                raise ValueError(
                    f"{label} ranks by stage {sweep.stage!r}, which is not an evaluate stage: {evaluations}"
                )
            if not evaluations:
                raise ValueError(f"{label}: the pipeline has no evaluate stage whose {sweep.metric!r} would rank it")
            base = self.profiles.get(sweep.profile, {}) if sweep.profile else {}
            for key, values in sweep.over.items():
                stage_name, *path = key.split(".")
                stage = self.stage_or_none(stage_name)
                if stage is None:
                    raise ValueError(
                        f"{label}: {key!r} names {stage_name!r}, which is not a stage; stages: {list(self._upstream)}"
                    )
                self._check_tunable_path(f"{label}: {key!r}", type(stage), path)
                read = []  # each value as the stage's model reads it (YAML's '2e-4' string: a number)
                for value in values:
                    made = self._check_overrides(f"{label}, {key}={value!r}", overlay(base, nested({key: value})))
                    for part in [stage_name, *path]:
                        made = made[part] if isinstance(made, dict) else getattr(made, part)
                    read.append(made.model_dump() if isinstance(made, Settings) else made)
                sweep.over[key] = read

    @staticmethod
    def _check_tunable_path(label: str, model: type[Settings], path: list[str]) -> None:
        """Each step of a dotted setting is a per-run field of the model it is in (the launchpad has only those)."""
        for i, part in enumerate(path):
            fields = tunable_fields(model)
            if part not in fields:
                where = ".".join(path[:i]) or "the stage"
                known = "unknown" if part not in model.model_fields else "not a per-run setting"
                raise ValueError(f"{label}: {part!r} is {known} in {where}; per-run settings there: {sorted(fields)}")
            annotation = fields[part]
            if i < len(path) - 1:
                if not (isinstance(annotation, type) and issubclass(annotation, Settings)):
                    raise ValueError(f"{label}: {part!r} has no settings inside it")
                model = annotation

    def _check_feedback(self) -> None:
        if self.feedback is None:
            return
        chat = self.first_dataset_of("chat")
        if self.first_of_role("merge") is None or chat is None:
            raise ValueError(
                "feedback retraining needs a merge stage (the deployed model) and a dataset of chat rows "
                "(held-out rows to compare on)"
            )
        if not self.feedback.evaluate.dataset:
            self.feedback.evaluate.dataset = chat.name

    # ---- reading it

    def role_of(self, stage: Stage) -> str:
        return catalog.get(stage.kind).role

    def first_of_role(self, role: str) -> Stage | None:
        return next((st for st in self.stages if self.role_of(st) == role), None)

    def first_dataset_of(self, rows: str) -> Stage | None:
        """The first stage whose rows are of this shape (chat, pairs, rated, prompts)."""
        return next((st for st in self.stages if getattr(st, "makes", None) == rows), None)

    def stage(self, name: str) -> Stage:
        return next(st for st in self.stages if st.name == name)

    def stage_or_none(self, name: str) -> Stage | None:
        return next((st for st in self.stages if st.name == name), None)

    @staticmethod
    def kinds_making(rows: str) -> list[str]:
        """The kinds whose datasets hold rows of this shape (for messages that say what to use)."""
        return catalog.kinds_making(rows)

    @staticmethod
    def kinds_training_on(rows: str) -> list[str]:
        return catalog.kinds_training_on(rows)

    def system_prompt(self, before: str | None = None) -> str | None:
        """The one system prompt of the chat dataset the first training stage (before stage `before`, default
        anywhere) trained on: what the model learned to answer after, so chat and feedback should send it too. Its
        `system:` text, or the value its column or template has on every row; None when it has none or the value
        differs between rows (each row taught its own: no single prompt to send)."""
        dataset = self.system_dataset(before)
        return dataset.one_system(self) if dataset else None

    def system_prompt_dataset(self, before: str | None = None) -> str | None:
        """The chat dataset whose `system:` is one text (not a column's or template's value per row) that is the
        pipeline's system prompt (see system_prompt), or None. Its build registers that text in MLflow's Prompt
        Registry (engine/release/prompt_registry.py)."""
        dataset = self.system_dataset(before)
        return dataset.name if dataset and not dataset.per_row_system(self) else None

    def system_dataset(self, before: str | None = None):
        """The chat dataset with a `system:` that the first training stage in the chain trains on, or None."""
        names = [st.name for st in self.stages]
        stages = self.stages[: names.index(before)] if before else self.stages
        training = [st for st in stages if self.role_of(st) == "training" and st.in_chain]
        if not training or training[0].dataset not in names:
            return None
        dataset = self.stage(training[0].dataset)
        chat = getattr(dataset, "makes", None) == "chat"
        return dataset if chat and getattr(dataset, "system", None) else None

    def upstream(self, name: str) -> list[str]:
        """Asset names the stage reads, in the order its asset takes them."""
        return self._upstream[name]

    def previous(self, name: str) -> str | None:
        """The training stage a stage continues from (its adapter chain), or None when it starts afresh."""
        return self._previous.get(name)

    def profile(self, name: str) -> dict[str, dict]:
        if name not in self.profiles:
            raise PipelineError(f"pipeline {self.name!r} has no profile {name!r}; it has {sorted(self.profiles)}")
        return self.profiles[name]

    def sweep(self, name: str) -> Sweep:
        if name not in self.sweeps:
            raise PipelineError(f"pipeline {self.name!r} has no sweep {name!r}; it has {sorted(self.sweeps)}")
        return self.sweeps[name]

    def sweep_overrides(self, name: str, point: dict[str, Any]) -> dict[str, dict]:
        """A point's per-run overrides {stage: {setting: value}}: the sweep's profile, with the point over it."""
        sweep = self.sweep(name)
        return overlay(self.profile(sweep.profile) if sweep.profile else {}, nested(point))

    def sweep_stage(self, name: str) -> str:
        """The evaluate stage whose MLflow run holds the metric a sweep is ranked by."""
        sweep = self.sweep(name)
        return sweep.stage or [s.name for s in self.stages if self.role_of(s) == "evaluate"][-1]

    @property
    def source_file(self) -> str | None:
        return self._source_file

    def located(self, source_file: str | Path | None) -> Pipeline:
        """This pipeline with its file paths resolved against the folder of the YAML that declared it."""
        base = Path(source_file).parent if source_file else None
        datasets = {n: d.model_copy(update={"path": str(resolve_path(d.path, base))}) for n, d in self.datasets.items()}
        stages = [located_stage(st, base) for st in self.stages]
        tools = self.tools
        if tools is not None and tools.file:
            tools = tools.model_copy(update={"file": str(resolve_path(tools.file, base))})
        out = self.model_copy(update={"datasets": datasets, "stages": stages, "tools": tools})
        out._source_file = str(source_file) if source_file else None
        return out


def located_stage(stage: Stage, base: Path | None) -> Stage:
    """A stage with the files it names (its `path`, a mixture's sources' paths) resolved against base."""
    update = {}
    if getattr(stage, "path", None):
        update["path"] = str(resolve_path(stage.path, base))
    if getattr(stage, "sources", None):
        update["sources"] = [
            s.model_copy(update={"path": str(resolve_path(s.path, base))}) if s.path else s for s in stage.sources
        ]
    return stage.model_copy(update=update) if update else stage


def resolve_path(path: str, base: Path | None) -> Path:
    if path.startswith("example:"):
        return EXAMPLE_DIR / path.split(":", 1)[1]
    candidate = Path(path).expanduser()
    if not candidate.is_absolute() and base is not None:
        candidate = base / candidate
    return candidate
