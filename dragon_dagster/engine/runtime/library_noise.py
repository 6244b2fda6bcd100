"""Library warnings (the warnings module) a worker's user can do nothing about, silenced by name, each with its
reason; every other warning still shows. A library's log records are filtered where they are emitted, with the
reason there: lm-eval's hints (evaluate/general_skills.py), MLflow's CloudPickle notice (release/model_registry.py)."""

from __future__ import annotations

import functools
import os
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
    """Install the filters for KNOWN in this process; hide the libraries' progress bars where BARS_ENV says."""
    for category, message, _reason in KNOWN:
        warnings.filterwarnings("ignore", message=message, category=category)
    if bars_hidden():
        hide_progress_bars()


# Set to "off" by a launcher whose terminal draws its own progress (`dragon demo`): the worker then shows none of
# the libraries' tqdm bars (the datasets' map, the weights' loading, the trainer's own), which it shares that
# terminal with. Read when a job starts, not when the libraries are imported: a warm worker's jobs differ here.
BARS_ENV = "DRAGON_LIBRARY_PROGRESS_BARS"


def bars_hidden() -> bool:
    return os.environ.get(BARS_ENV, "").lower() == "off"


def hide_progress_bars(importing: bool = True) -> None:
    """Turn off the tqdm bars of huggingface_hub, transformers and datasets in this process, through each one's
    own switch. transformers takes the hub's at its import; importing=False leaves a library not yet imported to
    that (a launcher that may never import datasets), a worker imports both here."""
    import sys

    from huggingface_hub.utils import disable_progress_bars

    disable_progress_bars()
    if importing or "transformers" in sys.modules:
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()
    if importing or "datasets" in sys.modules:
        import datasets

        datasets.disable_progress_bars()
    # MLflow reads its switch when it downloads (a merge's adapters, the registry's files)
    os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = "false"
    hide_tqdm()


TQDM_OFF = "_dragon_bars_off"


def hide_tqdm() -> None:
    """Every tqdm bar made from now on in this process is off. tqdm's own switch (TQDM_DISABLE) is read once, when
    tqdm is first imported, which in a warm worker or the `dragon` command is before a job says whether bars are
    wanted; and lm-eval's requests, MLflow's evaluate and transformers' GGUF reader draw bars with no switch of
    their own (lm-eval passes disable=False), so the bar's constructor is told disable=True here."""
    import tqdm.std

    init = tqdm.std.tqdm.__init__
    if getattr(init, TQDM_OFF, False):
        return

    @functools.wraps(init)
    def off(self, *args, **kwargs):
        if len(args) < 10:  # disable is the tenth positional argument after self: nobody passes it so
            kwargs["disable"] = True
        init(self, *args, **kwargs)

    setattr(off, TQDM_OFF, True)
    tqdm.std.tqdm.__init__ = off


def show_tqdm() -> None:
    """tqdm's bars as tqdm draws them again (for tests, which share a process)."""
    import tqdm.std

    init = tqdm.std.tqdm.__init__
    if getattr(init, TQDM_OFF, False):
        tqdm.std.tqdm.__init__ = init.__wrapped__
