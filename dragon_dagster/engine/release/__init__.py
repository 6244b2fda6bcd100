"""Releasing a model: the adapter chain merged into its base (merge.py), model cards (card.py), GGUF files and an
Ollama Modelfile (export/), and versions with aliases in the MLflow Model Registry (model_registry.py)."""
