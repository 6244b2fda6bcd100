"""The conftest guard that removes a test's own project modules from sys.modules (tests/support.forget_modules)."""

import importlib
import sys

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
