"""Which of a pipeline's stages are out of date, and why: what the Dagster UI shows as "unsynced", in a table.

Dagster decides it from the assets' code versions (each stage's version, engine/pipeline/versions.py) and the data
versions its materializations recorded: a stage is unsynced when its version changed since it was made (its
settings, a file it reads, the base model, its kind's code) or when a stage it reads was made again since. Dagster
1.13 does not pass "unsynced" on to what reads an unsynced stage until that stage is made again; this table does
(status "unsynced", reason "reads X, which is out of date"), since a run would make those again too. In the UI,
materializing the whole pipeline makes exactly these and reuses the rest (assets/reuse.py).
`dragon status <pipeline>` prints it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dagster import AssetKey, DagsterInstance

from ..engine.pipeline import Pipeline

WORDS = {"FRESH": "fresh", "STALE": "unsynced", "MISSING": "never made"}


@dataclass(frozen=True)
class StageState:
    """One asset of the pipeline: fresh, unsynced (with Dagster's reasons, root causes first) or never made."""

    name: str
    status: str
    reasons: list[str] = field(default_factory=list)
    code_version: str | None = None


def _resolver(instance: DagsterInstance, assets: list):
    # Dagster's own resolver of the UI's "unsynced" (its GraphQL builds the same one); the view it takes pins the
    # moment the statuses are read at
    from dagster._core.asset_graph_view.asset_graph_view import AssetGraphView, TemporalContext
    from dagster._core.definitions.assets.graph.asset_graph import AssetGraph
    from dagster._core.definitions.data_version import CachingStaleStatusResolver
    from dagster._time import get_current_datetime

    graph = AssetGraph.from_assets(assets)
    view = AssetGraphView(
        temporal_context=TemporalContext(effective_dt=get_current_datetime(), last_event_id=None),
        instance=instance,
        asset_graph=graph,
    )
    return CachingStaleStatusResolver(instance=instance, asset_graph=graph, loading_context=view), graph


def _reason(cause, pipeline: Pipeline) -> str:
    def name(key: AssetKey | None) -> str:
        if key is None:
            return ""
        return key.path[-1] if key.path[:1] == [pipeline.name] else key.to_user_string()

    what = f"{name(cause.asset_key)} {cause.reason}"
    return what + (f" ({name(cause.dependency_asset_key)})" if cause.dependency_asset_key else "")


def stage_states(pipeline: Pipeline, assets: list, instance: DagsterInstance) -> list[StageState]:
    """The state of each of the pipeline's training assets (its datasets and stages, in order), as the Dagster UI
    shows it. assets: the pipeline's asset definitions (build_pipeline_defs(pipeline)["assets"])."""
    resolver, graph = _resolver(instance, assets)
    out, behind = [], set()
    for name in [*pipeline.datasets, *(s.name for s in pipeline.stages)]:  # upstream before downstream
        key = AssetKey([pipeline.name, name])
        status = resolver.get_status(key).value
        reasons = [_reason(c, pipeline) for c in resolver.get_stale_root_causes(key)] if status == "STALE" else []
        if status == "FRESH":
            late = sorted(k.path[-1] for k in graph.get(key).parent_keys if k in behind)
            if late:
                status, reasons = "STALE", [f"reads {up}, which is out of date" for up in late]
        if status != "FRESH":
            behind.add(key)
        out.append(StageState(name, WORDS[status], reasons, graph.get(key).code_version))
    return out
