"""The one Definitions object: every pipeline YAML's assets, checks and jobs, with resources from the env."""

from __future__ import annotations

from pathlib import Path

from dagster import Definitions

from .assets import build_pipeline_defs
from .engine.pipeline_spec import discover
from .resources import ArtifactStore, MLflowTracking, TrainingResource


def default_resources() -> dict:
    return {"store": ArtifactStore(), "tracking": MLflowTracking(), "training": TrainingResource()}


def build_definitions(pipeline_dirs: list[Path] | None = None, resources: dict | None = None) -> Definitions:
    assets, checks, jobs = [], [], []
    for pipeline in discover(pipeline_dirs):
        parts = build_pipeline_defs(pipeline)
        assets += parts["assets"]
        checks += parts["asset_checks"]
        jobs += parts["jobs"]
    return Definitions(assets=assets, asset_checks=checks, jobs=jobs, resources=resources or default_resources())


defs = build_definitions()
