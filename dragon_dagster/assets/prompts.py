"""The pipeline's system prompt through the Dagster layer: registered when its dataset is built, linked to the
runs that train on it, and the live version sent by export and evaluation (engine/release/prompt_registry.py says
who moves the alias). The URI each used goes into its manifest, metadata and MLflow tags, so a changed prompt
shows in lineage: a new version on the dataset, the runs linked to it, the export and report that sent it."""

from __future__ import annotations

import json
from pathlib import Path

from dagster import Failure

from ..engine.artifacts.manifest import MANIFEST
from ..engine.data.tables import read_jsonl, write_jsonl
from ..engine.pipeline import Pipeline
from ..engine.release.model_registry import RegistryError
from ..engine.release.prompt_registry import register_pipeline_prompt, system_of

PROMPT_TAG = "system_prompt"  # on MLflow runs: the prompts:/ URI of the system prompt the run used


def register_dataset_prompt(pipeline: Pipeline, stage_name: str, system: str | None, tracking) -> str | None:
    """The registered version of the system prompt a dataset was built with, when the dataset is the pipeline's
    prompt dataset (Pipeline.system_prompt_dataset): its URI, else None. system: the effective settings' text (a
    launchpad override counts: it is what the rows hold)."""
    if not system or stage_name != pipeline.system_prompt_dataset():
        return None
    try:
        return register_pipeline_prompt(tracking.client(), pipeline.name, system, f"{pipeline.name}/{stage_name}").uri
    except RegistryError as exc:
        raise Failure(description=f"{stage_name}: {exc} (tracking URI {tracking.shown_uri})") from exc


def live_system(pipeline: Pipeline, tracking, fallback: str | None) -> tuple[str | None, str | None]:
    """(text, URI) of the live system prompt; the pipeline's own text with no URI when nothing is registered."""
    if fallback is None:
        return None, None  # no fixed system prompt (none, or one templated per row): nothing registered to look up
    try:
        return system_of(tracking.client(), pipeline.name, fallback)
    except RegistryError as exc:
        raise Failure(description=f"{exc} (tracking URI {tracking.shown_uri})") from exc


def dataset_prompt_uri(dataset_dir: str | Path) -> str | None:
    """The prompt URI a dataset's manifest records (any manifest kind: only chat datasets have one)."""
    path = Path(dataset_dir) / MANIFEST
    if not path.exists():
        return None
    return json.loads(path.read_text()).get("system_prompt_uri")


def link_prompt(tracking, run_id: str, uri: str | None) -> None:
    """Show the prompt version on the run's page: MLflow's linked-prompts tag, written through this resource's
    client (MlflowClient.link_prompt_version_to_run writes it through the process-wide tracking store, which is not
    this resource's store when the resource names its own URI)."""
    if not uri:
        return
    from mlflow.tracing.constant import TraceTagKey
    from mlflow.tracing.utils.prompt import update_linked_prompts_tag

    client = tracking.client()
    current = client.get_run(run_id).data.tags.get(TraceTagKey.LINKED_PROMPTS)
    client.set_tag(run_id, TraceTagKey.LINKED_PROMPTS, update_linked_prompts_tag(current, [client.load_prompt(uri)]))


def rows_with_system(path: Path, old: str | None, new: str | None, out: Path) -> tuple[Path, int]:
    """(the rows file to evaluate, how many rows were changed): held-out chat rows whose system turn is the
    pipeline's own text `old` get the live version `new` instead, written to `out`; the rows file itself when the
    two are the same (or either is missing), so an evaluation sends what chat sends."""
    if not old or not new or old == new or not path.exists():
        return path, 0
    rows, changed = read_jsonl(path), 0
    for row in rows:
        turns = row.get("prompt")
        if isinstance(turns, list) and turns and turns[0].get("role") == "system" and turns[0].get("content") == old:
            turns[0] = {**turns[0], "content": new}
            changed += 1
    if not changed:
        return path, 0
    write_jsonl(out, rows)
    return out, changed
