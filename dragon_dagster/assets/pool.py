"""The training pool: steps that load a model (training, synthesis, merge, evaluation, export) run one at a time,
so two never fight over one GPU."""

from dagster import multiprocess_executor

TRAINING_POOL = "training"
# The pool is held per run (dagster.yaml: a waiting run stays queued, no process); inside one run, the same tag
# keeps two pooled steps (the main chain and the feedback branch, say) from running at once.
POOL_TAGS = {"dragon/pool": TRAINING_POOL}
POOL_EXECUTOR = multiprocess_executor.configured(
    {"tag_concurrency_limits": [{"key": "dragon/pool", "value": TRAINING_POOL, "limit": 1}]}, name="pool_executor"
)
