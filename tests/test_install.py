"""What `make install` leaves in the virtual environment."""

import importlib.util
import os
import sys

import pytest


@pytest.mark.parametrize("name", ["torch", "transformers", "trl", "peft", "dagster", "mlflow"])
def test_the_heavy_libraries_are_installed_with_their_bytecode(name):
    """Where PYTHONDONTWRITEBYTECODE is set (CI's machines) a library installed without its bytecode is compiled
    again by every process that imports it: the suites took half as long again."""
    spec = importlib.util.find_spec(name)
    assert spec and spec.origin, name
    compiled = importlib.util.cache_from_source(spec.origin)
    assert os.path.exists(compiled), (
        f"{name} has no bytecode ({compiled}) in {sys.prefix}: install with `uv pip install --compile-bytecode` "
        "(the Makefile does) or pip"
    )
