"""A user's Python file (a custom reward, a pipeline's tools) run as a module of its own.

SourceFileLoader accepts any file name; registering the module in sys.modules lets get_type_hints, dataclasses and
pickling inside it find it. A file that fails to run is unregistered again and its error raised to the caller,
which names what the file was for.
"""

from __future__ import annotations

import sys
from importlib.machinery import SourceFileLoader
from importlib.util import module_from_spec, spec_from_loader
from pathlib import Path
from types import ModuleType


def run_file(path: Path, prefix: str) -> ModuleType:
    """The module made by running the file at path, registered as <prefix>_<hash of its path>."""
    name = f"{prefix}_{abs(hash(str(Path(path).resolve())))}"
    spec = spec_from_loader(name, SourceFileLoader(name, str(path)))
    module = module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module
