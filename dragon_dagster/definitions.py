"""The one Definitions object: every pipeline YAML's assets, checks, jobs, sensors and schedules, with
resources from the environment."""

from __future__ import annotations

from pathlib import Path

from dagster import Definitions

from .assets import build_pipeline_defs
from .engine.pipeline_spec import discover
from .resources import ArtifactStore, MLflowTracking, TrainingResource


def default_resources() -> dict:
    return {"store": ArtifactStore(), "tracking": MLflowTracking(), "training": TrainingResource()}


def build_definitions(pipeline_dirs: list[Path] | None = None, resources: dict | None = None) -> Definitions:
    parts = {"assets": [], "asset_checks": [], "jobs": [], "sensors": [], "schedules": []}
    for pipeline in discover(pipeline_dirs):
        for name, values in build_pipeline_defs(pipeline).items():
            parts[name] += values
    return Definitions(**parts, resources=resources or default_resources())


defs = build_definitions()
