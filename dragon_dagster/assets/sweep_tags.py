"""The run tags of a sweep's point (sweep.py submits them), which the stages copy onto their MLflow runs."""

SWEEP_TAG = "dragon/sweep"
POINT_TAG = "dragon/sweep_point"
SETTINGS_TAG = "dragon/sweep_settings"
RANK_TAG = "dragon/sweep_rank"  # {metric, goal, stage}: how compare ranks the points, as submitted
SWEEP_TAGS = (SWEEP_TAG, POINT_TAG, SETTINGS_TAG, RANK_TAG)


def sweep_tags_of(tags: dict[str, str]) -> dict[str, str]:
    """A run's sweep tags, for the MLflow runs of its stages."""
    return {k: v for k, v in tags.items() if k in SWEEP_TAGS}
