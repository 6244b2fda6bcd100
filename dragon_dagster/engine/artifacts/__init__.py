"""Artifact directories on disk: written under a temporary name and published whole (directories.py), each with
a typed manifest (manifest.py), training checkpoints (checkpoints.py) and per-step progress rows (progress.py)."""
