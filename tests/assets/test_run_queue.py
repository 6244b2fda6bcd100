"""The instance settings `make` and `dragon demo` copy into $DAGSTER_HOME (issue 12, item 9): a run that needs a
full `training` pool waits QUEUED in the run queue, with no process, instead of starting and polling for the
slot (measured: 14-16% of a core per waiting run with the default op granularity, 0 queued)."""

import shutil
from pathlib import Path

from dagster import DagsterInstance
from dagster._core.instance.config import PoolGranularity
from dagster._core.run_coordinator import QueuedRunCoordinator

from dragon_dagster.cli import PROJECT_DAGSTER_YAML

REPO_YAML = PROJECT_DAGSTER_YAML


def test_runs_wait_for_the_training_pool_in_the_queue(tmp_path):
    shutil.copy(REPO_YAML, tmp_path / "dagster.yaml")
    with DagsterInstance.from_config(str(tmp_path)) as instance:
        assert isinstance(instance.run_coordinator, QueuedRunCoordinator)  # the daemon dequeues runs
        pools = instance.get_concurrency_config().pool_config
        assert pools.pool_granularity == PoolGranularity.RUN  # held in the queue while a run holds the pool
        assert pools.default_pool_limit == 1  # the training pool: one at a time
        assert instance.get_concurrency_config().run_queue_config.should_block_op_concurrency_limited_runs


def test_pooled_steps_inside_one_run_go_one_at_a_time(tmp_path):
    """Pools are held per run; inside a run the pipeline jobs' executor keeps pooled steps (two independent
    trainings, say) from overlapping. A real multiprocess run through `dagster job execute`."""
    import os
    import subprocess
    import sys

    times = tmp_path / "times.txt"
    (tmp_path / "jobdef.py").write_text(f"""\
import time
from dagster import asset, define_asset_job, Definitions
from dragon_dagster.assets.pool import POOL_EXECUTOR, POOL_TAGS

def make(name):
    @asset(name=name, op_tags=POOL_TAGS)
    def _a():
        start = time.time()
        time.sleep(2)
        with open({str(times)!r}, "a") as f:
            f.write(f"{{name}} {{start}} {{time.time()}}\\n")
    return _a

job = define_asset_job("both", selection=["a", "b"], executor_def=POOL_EXECUTOR)
defs = Definitions(assets=[make("a"), make("b")], jobs=[job])
""")
    (tmp_path / "home").mkdir()
    out = subprocess.run(
        [str(Path(sys.executable).parent / "dagster"), "job", "execute", "-f", "jobdef.py", "-j", "both"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "DAGSTER_HOME": str(tmp_path / "home")},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    spans = sorted(tuple(map(float, line.split()[1:])) for line in times.read_text().splitlines())
    assert len(spans) == 2 and spans[0][1] <= spans[1][0], f"pooled steps overlapped: {spans}"
