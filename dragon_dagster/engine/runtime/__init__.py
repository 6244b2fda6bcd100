"""Where jobs run: the worker process (worker.py, execution.py), its Ray Train driver (ray_driver.py), jobs and
artifacts shipped through an object store (remote.py), and the CPU, memory and GPU figures it samples
(system_metrics.py)."""
