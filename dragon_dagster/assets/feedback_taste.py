"""The promotion gate's taste (feedback.gate.taste): the rewards that say which replies are liked, built once for
the datasets (a broken taste fails before anything trains) and the retrained report that scores with it."""

from pathlib import Path

from dagster import Failure

from ..engine.pipeline import Pipeline
from ..engine.rewards import RewardError, RewardSet


def taste_rewards(pipeline: Pipeline) -> RewardSet | None:
    """The gate's taste as rewards (custom files found relative to the pipeline's YAML); a Failure naming the
    problem when one cannot be built (a missing file, say), so a retraining fails before it trains."""
    if not pipeline.feedback.gate.taste:
        return None
    base = Path(pipeline.source_file).parent if pipeline.source_file else None
    try:
        return RewardSet.from_list(pipeline.feedback.gate.taste, base_dir=base)
    except RewardError as exc:
        raise Failure(description=f"{pipeline.name} feedback.gate.taste: {exc}") from exc


def taste_model_stages(pipeline: Pipeline) -> list[str]:
    """The reward-model stages the gate's taste names (rlhf's feedback_reward_model)."""
    return list(dict.fromkeys(r.stage for r in pipeline.feedback.gate.taste or [] if r.type == "reward_model"))
