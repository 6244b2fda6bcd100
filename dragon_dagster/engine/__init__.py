"""Framework-free core of dragon-dagster: data mapping, models, trainers, metrics, evaluation.

Nothing here imports dagster; the Dagster layer (assets/, resources/) calls into these modules, and so can a
notebook or a plain script.
"""
