"""The training pool: steps that load a model (training, synthesis, merge, evaluation, export) run one at a time,
so two never fight over one GPU."""

from dagster import multiprocess_executor

TRAINING_POOL = "training"
# The pool is held per run (dagster.yaml: a waiting run stays queued, no process); inside one run, the same tag
# keeps two pooled steps (the main chain and the feedback branch, say) from running at once.
POOL_TAGS = {"dragon/pool": TRAINING_POOL}
# Each step runs in a process forked from one that imported these once per run (Dagster's forkserver start method),
# not in a fresh interpreter that imports Dagster, MLflow and the component again (~2 s a step on 2 cores; a
# pipeline has a dozen steps with its checks), then transformers for a model's config or tokenizer (~2 s more in
# each model step). The forkserver imports torch with transformers but runs no torch op, as the warm worker.
# The code location's own module is small and still imported per step.
STEP_PRELOAD = ["dagster", "dragon_dagster.assets.component", "dragon_dagster.resources", "transformers"]
POOL_EXECUTOR = multiprocess_executor.configured(
    {
        "tag_concurrency_limits": [{"key": "dragon/pool", "value": TRAINING_POOL, "limit": 1}],
        "start_method": {"forkserver": {"preload_modules": STEP_PRELOAD}},
    },
    name="pool_executor",
)
