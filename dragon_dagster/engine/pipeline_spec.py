"""Pipelines declared in YAML: a model, source datasets, and an ordered list of stages.

    name: support
    model: smollm2-135m
    datasets:
      tickets: {path: example:tickets.csv}
    stages:
      - {name: sft_dataset, kind: chat_dataset, source: tickets, prompt: "{subject}\\n\\n{body}", response: reply}
      - {name: sft_adapter, kind: sft, dataset: sft_dataset, args: {epochs: 3}}
      - {name: merged_model, kind: merge}
      - {name: evaluation_report, kind: evaluate, dataset: sft_dataset}
    profiles:
      quick: {sft_adapter: {max_steps: 20}}

Training stages chain in order (each continues from the one before, folding it in); a merge takes the
training stages before it; an evaluation measures the merge before it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

EXAMPLE_DIR = Path(__file__).resolve().parent.parent / "example_data"
BUNDLED_PIPELINES = Path(__file__).resolve().parent.parent / "pipelines"
TRAINING_KINDS = {"sft", "preference", "grpo"}
DATASET_KINDS = {"chat_dataset", "pairs_dataset", "prompt_dataset"}
KINDS = DATASET_KINDS | TRAINING_KINDS | {"preference_pairs", "synthetic_dataset", "merge", "evaluate"}
NAME = re.compile(r"^[a-z][a-z0-9_]*$")


class PipelineError(ValueError):
    """A pipeline YAML file is malformed."""


@dataclass
class Stage:
    name: str
    kind: str
    settings: dict[str, Any]
    upstream: list[str] = field(default_factory=list)   # asset names this stage reads


@dataclass
class Pipeline:
    name: str
    model: str
    datasets: dict[str, dict[str, Any]]
    stages: list[Stage]
    description: str = ""
    profiles: dict[str, dict[str, dict]] = field(default_factory=dict)
    source_file: str | None = None
    feedback: dict[str, Any] | None = None   # retraining from chat feedback: thresholds, schedule, settings

    def first(self, kind: str) -> Stage | None:
        return next((s for s in self.stages if s.kind == kind), None)

    def stage(self, name: str) -> Stage:
        return next(s for s in self.stages if s.name == name)

    def profile(self, name: str) -> dict[str, dict]:
        if name not in self.profiles:
            raise PipelineError(f"pipeline {self.name!r} has no profile {name!r}; it has {sorted(self.profiles)}")
        return self.profiles[name]


def resolve_path(path: str, base: Path | None) -> Path:
    if path.startswith("example:"):
        return EXAMPLE_DIR / path.split(":", 1)[1]
    candidate = Path(path).expanduser()
    if not candidate.is_absolute() and base is not None:
        candidate = base / candidate
    return candidate


def parse(data: dict, source_file: Path | None = None) -> Pipeline:
    where = str(source_file or "pipeline")
    if not isinstance(data, dict):
        raise PipelineError(f"{where}: expected a mapping at the top level")
    name = data.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise PipelineError(f"{where}: name must be lower-case letters, digits and underscores, got {name!r}")
    base = source_file.parent if source_file else None
    datasets = {}
    for ds_name, ds in (data.get("datasets") or {}).items():
        if not NAME.match(ds_name) or not isinstance(ds, dict) or "path" not in ds:
            raise PipelineError(f"{where}: dataset {ds_name!r} needs a name like 'tickets' and a path")
        datasets[ds_name] = {**ds, "path": str(resolve_path(str(ds["path"]), base))}
    stages, seen = [], set(datasets)
    last_training, last_merge, training_before = None, None, []
    for raw in data.get("stages") or []:
        if not isinstance(raw, dict) or "name" not in raw or "kind" not in raw:
            raise PipelineError(f"{where}: each stage needs a name and a kind, got {raw!r}")
        stage_name, kind = raw["name"], raw["kind"]
        settings = {k: v for k, v in raw.items() if k not in ("name", "kind")}
        if not NAME.match(stage_name) or stage_name in seen:
            raise PipelineError(f"{where}: stage name {stage_name!r} is invalid or used twice")
        if kind not in KINDS:
            raise PipelineError(f"{where}: stage {stage_name!r} has unknown kind {kind!r}; known: {sorted(KINDS)}")
        upstream = []
        if kind in DATASET_KINDS and "path" in settings:  # reads its own file: no separate source asset
            settings["path"] = str(resolve_path(str(settings["path"]), base))
        elif kind in DATASET_KINDS:
            upstream = [_ref(settings, "source", seen, where, stage_name)]
        elif kind == "preference_pairs":  # the latest adapter answers the dataset's prompts
            if not last_training:
                raise PipelineError(f"{where}: preference_pairs stage {stage_name!r} needs a training stage "
                                    "before it: its samples are the student's replies")
            upstream = [_ref(settings, "dataset", seen, where, stage_name), last_training]
        elif kind == "synthetic_dataset":  # a teacher answers an earlier dataset's prompts
            upstream = [_ref(settings, "dataset", seen, where, stage_name)]
        elif kind == "preference" and not last_training:
            raise PipelineError(f"{where}: preference stage {stage_name!r} ({settings.get('method', 'dpo')}) has no "
                                "training stage before it to continue from; put an sft stage first")
        elif kind in TRAINING_KINDS:
            upstream = [_ref(settings, "dataset", seen, where, stage_name)] + ([last_training] if last_training else [])
            last_training = stage_name
            training_before.append(stage_name)
        elif kind == "merge":
            if not last_training:
                raise PipelineError(f"{where}: merge stage {stage_name!r} has no training stage before it")
            upstream = [last_training]
            last_merge = stage_name
        elif kind == "evaluate":
            if not last_merge:
                raise PipelineError(f"{where}: evaluate stage {stage_name!r} has no merge stage before it")
            upstream = [last_merge, _ref(settings, "dataset", seen, where, stage_name)]
        stages.append(Stage(stage_name, kind, settings, upstream))
        seen.add(stage_name)
    if not stages:
        raise PipelineError(f"{where}: no stages")
    return Pipeline(name=name, model=str(data.get("model", "smollm2-135m")), datasets=datasets, stages=stages,
                    description=str(data.get("description", "")), profiles=data.get("profiles") or {},
                    source_file=str(source_file) if source_file else None, feedback=_feedback(data, stages, where))


def _feedback(data: dict, stages: list[Stage], where: str) -> dict | None:
    feedback = data.get("feedback")
    if feedback is None:
        return None
    if not isinstance(feedback, dict):
        raise PipelineError(f"{where}: feedback must be a mapping")
    if not any(s.kind == "merge" for s in stages) or not any(s.kind == "chat_dataset" for s in stages):
        raise PipelineError(f"{where}: feedback retraining needs a merge stage (the deployed model) and a "
                            "chat_dataset (held-out rows to compare on)")
    return feedback


def _ref(settings: dict, key: str, seen: set[str], where: str, stage: str) -> str:
    value = settings.get(key)
    if value not in seen:
        raise PipelineError(f"{where}: stage {stage!r} needs {key}: the name of an earlier dataset or stage, "
                            f"got {value!r}; known so far: {sorted(seen)}")
    return value


def load(path: str | Path) -> Pipeline:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise PipelineError(f"{path}: not valid YAML: {exc}") from exc
    return parse(data, path)


def pipeline_dirs() -> list[Path]:
    """Bundled pipelines, plus every directory in $DRAGON_PIPELINES_DIR (os.pathsep-separated)."""
    extra = [Path(p) for p in os.environ.get("DRAGON_PIPELINES_DIR", "").split(os.pathsep) if p]
    return [BUNDLED_PIPELINES, *extra]


def discover(dirs: list[Path] | None = None) -> list[Pipeline]:
    pipelines: dict[str, Pipeline] = {}
    for directory in dirs if dirs is not None else pipeline_dirs():
        for file in sorted(Path(directory).glob("*.y*ml")):
            pipeline = load(file)
            if pipeline.name in pipelines:
                raise PipelineError(f"{file}: pipeline name {pipeline.name!r} is already used by "
                                    f"{pipelines[pipeline.name].source_file}")
            pipelines[pipeline.name] = pipeline
    return list(pipelines.values())
