"""Library warnings silenced by name (engine/runtime/library_noise.py, the registry's save): the listed ones go,
every other still shows."""

import logging
import os
import warnings

from dragon_dagster.engine.runtime import library_noise


def test_only_the_listed_library_warnings_are_silenced():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        library_noise.quiet()
        warnings.warn("`is_gradient_checkpointing` is deprecated (v6).", FutureWarning, stacklevel=1)
        warnings.warn("something else is deprecated", FutureWarning, stacklevel=1)
        warnings.warn("`is_gradient_checkpointing` is deprecated, said as a UserWarning", UserWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == [
        "something else is deprecated",
        "`is_gradient_checkpointing` is deprecated, said as a UserWarning",
    ]
    assert all(reason for _, _, reason in library_noise.KNOWN)


def test_saving_a_chat_model_does_not_warn_about_cloudpickle_and_keeps_other_records(tiny_model, tmp_path):
    from dragon_dagster.engine.release.model_registry import save_chat_model

    class Kept(logging.Handler):  # on the logger itself: MLflow's loggers do not propagate to the root
        def __init__(self):
            super().__init__(logging.WARNING)
            self.messages = []

        def emit(self, record):
            self.messages.append(record.getMessage())

    pyfunc_log, kept = logging.getLogger("mlflow.pyfunc"), Kept()
    pyfunc_log.addHandler(kept)
    try:
        save_chat_model(tiny_model, tmp_path / "chat_model")
        pyfunc_log.warning("a later warning of mlflow.pyfunc")
    finally:
        pyfunc_log.removeHandler(kept)
    assert (tmp_path / "chat_model" / "MLmodel").exists()
    assert kept.messages == ["a later warning of mlflow.pyfunc"]  # the CloudPickle notice went, the filter too


def test_a_worker_told_so_draws_none_of_the_libraries_progress_bars(monkeypatch, capfd):
    """`dragon demo` draws its own bar: its workers get BARS_ENV=off and the libraries' tqdm bars stay off."""
    import datasets
    from huggingface_hub.utils import are_progress_bars_disabled, enable_progress_bars
    from tqdm import tqdm
    from tqdm.auto import tqdm as auto_tqdm
    from transformers.utils import logging as transformers_logging

    def draw() -> str:
        datasets.Dataset.from_dict({"n": list(range(50))}).map(lambda row: row, desc="Tokenizing")
        for _ in transformers_logging.tqdm(range(3), desc="Loading weights"):
            pass
        # lm-eval's requests and transformers' GGUF reader: plain tqdm, with no switch of their own
        for _ in tqdm(range(3), desc="Running loglikelihood requests", disable=False):
            pass
        for _ in auto_tqdm(range(3), desc="Converting GGUF tensors"):
            pass
        return capfd.readouterr().err

    capfd.readouterr()
    monkeypatch.setenv(library_noise.BARS_ENV, "off")
    monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "true")  # restored after the test
    try:
        library_noise.quiet()
        assert are_progress_bars_disabled() and not transformers_logging.is_progress_bar_enabled()
        assert os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] == "false"  # MLflow's downloads
        hidden = draw()
    finally:  # as every other test expects them
        enable_progress_bars()
        transformers_logging.enable_progress_bar()
        datasets.enable_progress_bars()
        library_noise.show_tqdm()
    bars = ("Tokenizing", "Loading weights", "Running loglikelihood requests", "Converting GGUF tensors")
    assert not [bar for bar in bars if bar in hidden], hidden
    shown = draw()  # the same bars, on again: what the worker would have drawn
    assert all(bar in shown for bar in bars), shown
