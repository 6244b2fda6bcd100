"""Champion and challenger on live traffic: each version's liked rate from the ratings `dragon serve` stores, shown
in MLflow and Dagster, and the gate's last step when `feedback.gate.live` is set.

With `gate.live`, a retraining's promotion_gate that passes promotes no one (`await_live`): the retrained version
stays `challenger`, tagged `live_gate=waiting` with the newest feedback record id (`live_from`) and the champion it
must not be worse than (`live_against`). `dragon serve --challenger-share` sends it a share of the users. The
sensor `<pipeline>_live_gate_sensor` then, every tick:

- counts each registered version's ratings (engine/evaluate/live_rates.py) and, when they changed, writes them on
  the version in the MLflow registry (tags `live_liked`, `live_rated`, `live_liked_rate`) and as metrics of the
  version's run (`live/liked`, `live/rated`, `live/liked_rate`, step: the newest record id), so MLflow's charts
  compare versions;
- decides the waiting challenger once both versions have `min_ratings` ratings since `live_from`: promoted when
  the one-sided Fisher exact test does not say it is liked less (the server, watching the alias, swaps to it by
  itself), refused otherwise (`live_gate=refused`; the champion stays); a champion that moved meanwhile
  (`live_against` no longer the champion) supersedes it;
- says so on the challenger's asset in Dagster (an AssetObservation of `<pipeline>/retrained_model`: the decision
  in words, each version's liked rate, the counts tested and the p-value) whenever that changes.
"""

from __future__ import annotations

from dagster import AssetKey, AssetObservation, DefaultSensorStatus, MetadataValue, SensorResult, SkipReason, sensor

from ..engine.evaluate.live_rates import LiveDecision, Ratings, live_decision, rate
from ..engine.pipeline import Pipeline
from ..engine.release.model_registry import CHALLENGER, CHAMPION, alias_version, version_for
from ..resources import ArtifactStore, MLflowTracking
from .automation import feedback_records
from .metadata import md_table
from .promotion import promote_merged

GATE_TAG = "live_gate"  # waiting, promoted, refused or superseded
FROM_TAG = "live_from"  # the newest feedback record id when the challenger started waiting
AGAINST_TAG = "live_against"  # the champion's version then
DECISION_TAG = "live_decision"  # the decision in words
WAITING = "waiting"


def await_live(context, pipeline: Pipeline, tracking: MLflowTracking, store: ArtifactStore, merged_dir, reason: str):
    """The promotion_gate's pass under `gate.live`: the merged model becomes the waiting challenger (or, with no
    champion to compare with, the champion at once); metadata for the check."""
    live = pipeline.feedback.gate.live
    client = tracking.client()
    name = pipeline.name
    version = version_for(client, name, merged_dir)
    champion = alias_version(client, name, CHAMPION)
    if version is None or champion is None or champion == version:  # nothing to compare live: as without it
        promoted = promote_merged(context, name, tracking, merged_dir, reason)
        return {"live_gate": "not needed: no other champion to compare with", **promoted}
    tags = client.get_model_version(name, version).tags
    if tags.get(GATE_TAG):  # a reused report checked again: the version's live gate goes on as it was
        return {
            "live_gate": f"{tags[GATE_TAG]} (since record {tags.get(FROM_TAG, '?')})",
            "challenger": f"models:/{name}/{version}",
        }
    newest = feedback_records(pipeline, store, tracking).max_id()
    for tag, value in ((FROM_TAG, str(newest)), (AGAINST_TAG, champion), (GATE_TAG, WAITING)):  # the state last
        client.set_model_version_tag(name, version, tag, value)
    client.set_registered_model_alias(name, CHALLENGER, version)
    said = (
        f"waiting for live ratings: models:/{name}/{version} stays the challenger until it and models:/{name}/"
        f"{champion} each have {live.min_ratings} ratings after record {newest} (dragon serve --challenger-share); "
        f"promoted then unless a one-sided Fisher exact test says it is liked less (p < {live.alpha:g})"
    )
    context.log.info(said)
    return {"live_gate": said, "challenger": f"models:/{name}/{version}", "champion": f"models:/{name}/{champion}"}


def live_gate_sensor(pipeline: Pipeline):
    live = pipeline.feedback.gate.live

    @sensor(
        name=f"{pipeline.name}_live_gate_sensor",
        minimum_interval_seconds=30,
        default_status=DefaultSensorStatus.RUNNING,
        description=f"Writes each registered version's live liked rate into MLflow and promotes a challenger that "
        f"passed its retraining's gate once it and the champion have {live.min_ratings} ratings each and a "
        f"one-sided Fisher exact test (alpha {live.alpha:g}) does not say it is liked less.",
    )
    def _sensor(context, store: ArtifactStore, tracking: MLflowTracking):
        said, shown, events = live_gate_tick(pipeline, store, tracking, context.cursor)
        if shown != context.cursor:
            context.log.info(said)
        return SensorResult(skip_reason=SkipReason(said), cursor=shown, asset_events=events)

    return _sensor


def live_gate_tick(
    pipeline: Pipeline, store: ArtifactStore, tracking: MLflowTracking, cursor: str | None
) -> tuple[str, str, list[AssetObservation]]:
    """One look: (what was decided, in words; the new cursor; the observations to record)."""
    live = pipeline.feedback.gate.live
    client = tracking.client()
    name = pipeline.name
    # the newest id first (a primary key's last entry): a look with nothing new reads no rating, however many the
    # store holds; one with new ratings has the store count them (benchmarks/feedback_scale.py)
    source = feedback_records(pipeline, store, tracking)
    newest = source.max_id()
    champion = alias_version(client, name, CHAMPION)
    challenger = alias_version(client, name, CHALLENGER)
    tags = client.get_model_version(name, challenger).tags if challenger else {}
    seen = f"{newest}:{champion}:{challenger}:{tags.get(GATE_TAG)}"
    if cursor is not None and cursor.split("|", 1)[0] == seen:  # nothing new since the last look
        return cursor.split("|", 1)[1], cursor, []
    ratings = Ratings(source, name, newest)  # as of `newest`
    rates = ratings.rates()
    publish_rates(client, name, rates, newest)
    decision: LiveDecision | None = None
    if challenger is None or tags.get(GATE_TAG) != WAITING:
        said = f"no challenger waits for live ratings (challenger: {challenger or 'none'}, champion: {champion})"
    elif champion != tags.get(AGAINST_TAG):
        said = (
            f"superseded: the champion moved from {tags.get(AGAINST_TAG)} to {champion} since models:/{name}/"
            f"{challenger} passed its gate; it is not promoted (a new retraining gates against the new champion)"
        )
        client.set_model_version_tag(name, challenger, DECISION_TAG, said[:5000])
        client.set_model_version_tag(name, challenger, GATE_TAG, "superseded")
        seen = f"{newest}:{champion}:{challenger}:superseded"
    else:
        after_id = int(tags.get(FROM_TAG, 0))
        records = ratings.first([challenger, champion], after_id, live.min_ratings)
        decision = live_decision(records, name, challenger, champion, live.min_ratings, live.alpha, after_id=after_id)
        said = decision.reason
        if decision.promote is None and decision.challenger[1] == 0:
            said += "; none for the challenger yet: is `dragon serve --challenger-share` set?"
        if decision.promote is not None:
            client.set_model_version_tag(name, challenger, DECISION_TAG, said[:5000])
            client.set_model_version_tag(name, challenger, "live_p_value", f"{decision.p_value:.6g}")
            if decision.promote:
                tracking.promote(name, challenger, f"{name}_live_gate_sensor: {said}")
            verdict = "promoted" if decision.promote else "refused"
            client.set_model_version_tag(name, challenger, GATE_TAG, verdict)
            seen = f"{newest}:{alias_version(client, name, CHAMPION)}:{challenger}:{verdict}"
    event = observation(pipeline, client, challenger or champion, champion, challenger, rates, said, decision, live)
    return said, f"{seen}|{said}", [event]


def publish_rates(client, name: str, rates: dict[str, tuple[int, int]], newest: int) -> None:
    """Each version's live counts as tags of the registered version and metrics of its run, where they changed."""
    for version, (liked, rated) in rates.items():
        found = client.get_model_version(name, version)
        if found.tags.get("live_rated") == str(rated) and found.tags.get("live_liked") == str(liked):
            continue
        share = rate((liked, rated))
        for tag, value in (("live_liked", liked), ("live_rated", rated), ("live_liked_rate", f"{share:.4f}")):
            client.set_model_version_tag(name, version, tag, str(value))
        if found.run_id:
            for metric, value in (("live/liked", liked), ("live/rated", rated), ("live/liked_rate", share)):
                client.log_metric(found.run_id, metric, float(value), step=newest)


def observation(pipeline, client, version, champion, challenger, rates, said, decision, live) -> AssetObservation:
    """The live gate as the challenger's asset shows it (the version's own asset, else retrained_model)."""
    asset = client.get_model_version(pipeline.name, version).tags.get("asset_key") if version else None
    roles = {champion: "champion", challenger: "challenger"}
    table = [
        {
            "version": f"{pipeline.name}/{v}",
            "alias": roles.get(v, ""),
            "liked": liked,
            "rated": rated,
            "liked_rate": f"{liked / rated:.3f}",
        }
        for v, (liked, rated) in rates.items()
    ]
    metadata = {
        "live_gate": MetadataValue.text(said),
        "liked_rates": md_table(table, ["version", "alias", "liked", "rated", "liked_rate"]),
        "min_ratings": live.min_ratings,
        "alpha": live.alpha,
        **{f"live/{pipeline.name}/{v}/liked_rate": round(liked / rated, 4) for v, (liked, rated) in rates.items()},
    }
    if decision is not None:
        metadata["tested/challenger"] = f"{decision.challenger[0]}/{decision.challenger[1]}"
        metadata["tested/champion"] = f"{decision.champion[0]}/{decision.champion[1]}"
        if decision.p_value is not None:
            metadata["p_value"] = decision.p_value
    key = AssetKey.from_user_string(asset) if asset else AssetKey([pipeline.name, "retrained_model"])
    return AssetObservation(asset_key=key, description=said, metadata=metadata)
