"""The instance settings `make` and `dragon demo` copy into $DAGSTER_HOME (issue 12, item 9): a run that needs a
full `training` pool waits QUEUED in the run queue, with no process, instead of starting and polling for the
slot (measured: 14-16% of a core per waiting run with the default op granularity, 0 queued)."""

import shutil
from pathlib import Path

from dagster import DagsterInstance
from dagster._core.instance.config import PoolGranularity
from dagster._core.run_coordinator import QueuedRunCoordinator

REPO_YAML = Path(__file__).parent.parent / "dagster.yaml"


def test_runs_wait_for_the_training_pool_in_the_queue(tmp_path):
    shutil.copy(REPO_YAML, tmp_path / "dagster.yaml")
    with DagsterInstance.from_config(str(tmp_path)) as instance:
        assert isinstance(instance.run_coordinator, QueuedRunCoordinator)  # the daemon dequeues runs
        pools = instance.get_concurrency_config().pool_config
        assert pools.pool_granularity == PoolGranularity.RUN  # held in the queue while a run holds the pool
        assert pools.default_pool_limit == 1                  # the training pool: one at a time
        assert instance.get_concurrency_config().run_queue_config.should_block_op_concurrency_limited_runs
