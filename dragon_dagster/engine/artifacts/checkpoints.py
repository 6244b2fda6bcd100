"""Training checkpoints: which of a run's checkpoint-N directories transformers' Trainer can resume from."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

CHECKPOINT_PREFIX = "checkpoint-"
TRAINER_STATE = "trainer_state.json"
# Any one of these holds the weights transformers' Trainer loads on resume (adapter ones for LoRA).
CHECKPOINT_WEIGHTS = (
    "adapter_model.safetensors",
    "adapter_model.bin",
    "model.safetensors",
    "pytorch_model.bin",
    "model.safetensors.index.json",
    "pytorch_model.bin.index.json",
)


def checkpoint_step(path: str | Path) -> int | None:
    """N of a `checkpoint-N` directory name; None for any other name."""
    name = Path(path).name
    step = name[len(CHECKPOINT_PREFIX) :]
    return int(step) if name.startswith(CHECKPOINT_PREFIX) and step.isdigit() else None


def checkpoint_problem(path: str | Path) -> str | None:
    """Why transformers' Trainer could not resume from this checkpoint directory; None when it can.

    The Trainer saves a checkpoint as: weights, optimizer and scheduler, RNG state, then trainer_state.json.
    A kill during the save leaves the directory without trainer_state.json (or with a cut-off one), so a
    readable trainer_state.json for the directory's step, with the weights and the optimizer and scheduler
    state beside it, is a complete checkpoint.
    """
    path = Path(path)
    if not path.is_dir():
        return "not a directory"
    state_file = path / TRAINER_STATE
    if not state_file.is_file():
        return f"no {TRAINER_STATE}: the save did not finish"
    try:
        state = json.loads(state_file.read_text())
    except (OSError, ValueError) as exc:
        return f"{TRAINER_STATE} is unreadable ({type(exc).__name__}): the save did not finish"
    if not isinstance(state, dict) or not isinstance(state.get("global_step"), int):
        return f"{TRAINER_STATE} has no global_step"
    step = checkpoint_step(path)
    if step is not None and state["global_step"] != step:
        return f"{TRAINER_STATE} is for step {state['global_step']}, not {step}"
    weights = [path / name for name in CHECKPOINT_WEIGHTS if (path / name).is_file()]
    weights += [
        sub / name
        for sub in path.iterdir()
        if sub.is_dir()  # several adapters: one folder each
        for name in CHECKPOINT_WEIGHTS[:2]
        if (sub / name).is_file()
    ]
    if not weights:
        return "no model or adapter weights"
    for file in weights:
        if file.stat().st_size == 0:
            return f"{file.relative_to(path)} is empty"
        if file.name.endswith(".index.json"):
            try:
                shards = set(json.loads(file.read_text()).get("weight_map", {}).values())
            except (OSError, ValueError, AttributeError):
                return f"{file.name} is unreadable"
            missing = sorted(s for s in shards if not (path / s).is_file())
            if missing:
                return f"weight shards missing: {', '.join(missing[:3])}"
    if not any((path / name).is_file() for name in ("optimizer.pt", "optimizer.bin")):
        return "no optimizer state (optimizer.pt)"
    if not (path / "scheduler.pt").is_file():
        return "no scheduler state (scheduler.pt)"
    return None


def last_checkpoint(checkpoint_dir: str | Path, log: Callable[[str], None] | None = None) -> Path | None:
    """The highest-step complete checkpoint-N in checkpoint_dir; newer incomplete ones (a kill during the save)
    are skipped and named through log."""
    candidates = [p for p in Path(checkpoint_dir).glob("checkpoint-*") if checkpoint_step(p) is not None]
    for candidate in sorted(candidates, key=checkpoint_step, reverse=True):
        problem = checkpoint_problem(candidate)
        if problem is None:
            return candidate
        if log:
            log(f"skipping incomplete checkpoint {candidate}: {problem}")
    return None
