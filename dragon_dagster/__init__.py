"""dragon-dagster: post-train small language models with LoRA as Dagster assets tracked in MLflow.

The component is imported on first use, so that `dragon_dagster.engine` (and the worker process) never pays
for importing Dagster.
"""

_LAZY = {"PostTrainingPipeline": "dragon_dagster.assets.component"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dragon_dagster' has no attribute {name!r}")


def __dir__():  # dg finds components by listing the module
    return sorted(set(globals()) | set(_LAZY))
