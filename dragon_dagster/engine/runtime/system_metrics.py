"""CPU, memory and GPU use while a trainer runs, sampled in the worker and logged to the stage's MLflow run
under MLflow's own `system/...` names, so its "System metrics" charts fill in.

Sampled here rather than by MLflow's SystemMetricsMonitor in the Dagster step: the worker is where the
training runs (a Ray node, a pod), and it never imports MLflow (see worker.PipesReporter). A sample costs a
few psutil calls every `interval_s`, so it is on by default.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

INTERVAL_S = float(os.environ.get("DRAGON_SYSTEM_METRICS_INTERVAL_S", "10"))


def sample(process) -> dict[str, float]:
    """One reading, named as mlflow.system_metrics names them (plus this process's resident memory)."""
    import psutil

    memory = psutil.virtual_memory()
    values = {
        "system/cpu_utilization_percentage": psutil.cpu_percent(interval=None),
        "system/system_memory_usage_megabytes": (memory.total - memory.available) / 2**20,
        "system/system_memory_usage_percentage": memory.percent,
        "system/process_rss_megabytes": process.memory_info().rss / 2**20,
    }
    values.update(gpu_sample())
    return values


def gpu_sample() -> dict[str, float]:
    """Memory of each CUDA device this process uses, from torch (already loaded by the trainer); utilisation
    where pynvml is installed. Nothing on a machine without CUDA. Only rank 0's worker samples."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return {}
    values = {}
    for i in range(torch.cuda.device_count()):
        if not torch.cuda.memory_reserved(i):  # a device this process does not use: asking would open a context
            continue
        free, total = torch.cuda.mem_get_info(i)
        values[f"system/gpu_{i}_memory_usage_megabytes"] = (total - free) / 2**20
        values[f"system/gpu_{i}_memory_usage_percentage"] = 100 * (total - free) / total
        try:
            values[f"system/gpu_{i}_utilization_percentage"] = float(torch.cuda.utilization(i))
        except Exception:  # needs pynvml; memory alone is still worth charting
            pass
    return values


@contextmanager
def sampling(report, interval_s: float = INTERVAL_S) -> Iterator[None]:
    """report(step, values) every interval_s seconds in a daemon thread while the block runs, and once at its
    end; interval_s <= 0 turns it off."""
    if interval_s <= 0:
        yield
        return
    import psutil

    process, stop, count = psutil.Process(), threading.Event(), [0]
    psutil.cpu_percent(interval=None)  # the first call only starts the measurement

    def tick() -> None:
        try:
            report(count[0], sample(process))
        except Exception:  # a failed reading never stops training
            pass
        count[0] += 1

    def loop() -> None:
        while not stop.wait(interval_s):
            tick()

    thread = threading.Thread(target=loop, name="system-metrics", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)
        tick()
