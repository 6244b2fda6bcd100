"""Library warnings (the warnings module) a worker's user can do nothing about, silenced by name, each with its
reason; every other warning still shows. A library's log records are filtered where they are emitted, with the
reason there: lm-eval's hints (evaluate/general_skills.py), MLflow's CloudPickle notice (release/model_registry.py)."""

from __future__ import annotations

import warnings

KNOWN: list[tuple[type[Warning], str, str]] = [
    (
        FutureWarning,
        r"`is_gradient_checkpointing` is deprecated",
        "PEFT 0.21's PeftModel reads model.is_gradient_checkpointing, which transformers 5.2x deprecates for "
        "is_activation_checkpointing: PEFT's to change, harmless until transformers 6 (constraints.txt pins 5.24)",
    )
]


def quiet() -> None:
    """Install the filters for KNOWN in this process."""
    for category, message, _reason in KNOWN:
        warnings.filterwarnings("ignore", message=message, category=category)
