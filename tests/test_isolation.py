"""The conftest guard that removes a test's own project modules from sys.modules (tests/support.forget_modules)."""

import importlib
import os
import sys

import pytest

from tests.support import forget_modules


def test_a_projects_namespace_packages_go_whatever_order_they_are_met_in(tmp_path, monkeypatch):
    # trainlab/defs/ has no __init__.py, as a user's `dg` project; its parent listed first is the order that
    # once raised KeyError: 'trainlab' while the guard read the child's __path__.
    package = tmp_path / "lab_ns_guard" / "defs"
    package.mkdir(parents=True)
    (tmp_path / "lab_ns_guard" / "__init__.py").write_text("")
    (package / "tiny.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    outside = importlib.import_module("json")  # already imported, from the library: never dropped
    assert importlib.import_module("lab_ns_guard.defs.tiny").VALUE == 1
    assert getattr(sys.modules["lab_ns_guard.defs"], "__file__", None) is None  # a namespace package

    forget_modules(["lab_ns_guard", "lab_ns_guard.defs", "lab_ns_guard.defs.tiny", "json"], tmp_path)

    assert not [name for name in sys.modules if name.startswith("lab_ns_guard")]
    assert sys.modules["json"] is outside


def test_a_suite_started_in_the_background_runs_as_from_a_terminal():
    """`make test &` starts pytest with SIGINT ignored: conftest gives it Python's handler back, or a test that
    interrupts itself, and every child started after a Dagster run (SIGTERM mapped to SIGINT's handler), would
    not stop."""
    import signal

    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.getsignal(signal.SIGTERM) != signal.SIG_IGN


@pytest.mark.parametrize("turn", ["one", "two"])
def test_a_variable_a_test_sets_is_gone_after_it(turn):
    """A library may set a variable in the process (Gradio's Blocks sets HF_HUB_DISABLE_TELEMETRY): a job started
    after it would differ from the warm worker and start cold (three cold starts after the chat page's tests).
    Each turn finds the variable unset and sets it, as a library does (not through monkeypatch): whichever runs
    second fails if conftest's guard let the first one's stay, in either order."""
    assert "DRAGON_TEST_LEFT_BEHIND" not in os.environ, f"left behind by turn {os.environ['DRAGON_TEST_LEFT_BEHIND']}"
    os.environ["DRAGON_TEST_LEFT_BEHIND"] = turn
