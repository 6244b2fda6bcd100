"""The version of each stage: a digest of what decides its output, so that the same YAML gives the same version on
any machine and a change of anything that matters gives another.

A stage's version covers its settings as resolved (a file it names by path counts by its content, never by where
it lies), the base model's identity, the tools the pipeline declares (for the stages that run them), and the
version of its kind's code (`StageKind.version`, bumped when the kind's behaviour changes). A source file's
version is its content's digest. The Dagster layer sets them as the assets' code versions (what makes Dagster call
a stage unsynced) and compares them, with the inputs' artifacts, to decide whether an artifact already made can be
reused.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any

from .. import catalog
from ..config.stage import Stage

DIGEST = 12  # hex characters kept: a version is read by people, and 48 bits tell a pipeline's changes apart
PATH_KEYS = ("path", "file")  # settings naming a file to read: they count by its content
EDGE = 1 << 20  # of a large file, its size and its first and last MiB identify it (a model's weights)


def digest(value: Any) -> str:
    """A short, stable digest of a JSON-able value (keys sorted, so dict order never matters)."""
    text = json.dumps(value, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:DIGEST]


@functools.lru_cache(maxsize=256)
def _content(path: str, size: int, mtime_ns: int) -> str:
    """The digest of a file's bytes (size and mtime key the cache: a file changed in place is read again)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        if size <= 4 * EDGE:
            h.update(f.read())
        else:
            h.update(f.read(EDGE))
            f.seek(size - EDGE)
            h.update(f.read(EDGE))
            h.update(str(size).encode())
    return h.hexdigest()[:DIGEST]


def file_version(path: str | Path) -> str:
    """The digest of a file's content, or of a directory's files (their names relative to it and their contents);
    "missing" when there is nothing there (a version still, so the stage's own check names the missing file)."""
    path = Path(path)
    if path.is_file():
        stat = path.stat()
        return _content(str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
        return digest([[str(p.relative_to(path)), file_version(p)] for p in files])
    return "missing"


def _by_content(value: Any, base: Path | None, key: str | None = None) -> Any:
    """The settings with every file they name (relative ones against base, the pipeline's folder) replaced by its
    content's digest."""
    if isinstance(value, dict):
        return {k: _by_content(v, base, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_by_content(v, base) for v in value]
    if key in PATH_KEYS and isinstance(value, str) and value and not value.startswith("example:"):
        path = Path(value).expanduser()
        if not path.is_absolute() and base is not None:
            path = base / path
        if path.exists():
            return {"content": file_version(path)}
    return value


def model_identity(model: str) -> str:
    """A model's name as the hub or a preset knows it, or a local directory's content (not where it lies)."""
    return f"dir:{file_version(model)}" if Path(model).is_dir() else model


def stage_version(pipeline, stage: Stage) -> str:
    """The version of one stage of `pipeline` (an engine Pipeline) with the settings `stage` (the YAML's, or a
    run's effective ones)."""
    base = Path(pipeline.source_file).parent if pipeline.source_file else None
    parts = {
        "kind": [stage.kind, catalog.kind_of(stage).version],
        "settings": _by_content(stage.model_dump(mode="json"), base),
        "model": model_identity(pipeline.model),
    }
    if pipeline.tools is not None:  # every conversation is rendered with them, and a rollout may run them
        parts["tools"] = _by_content(pipeline.tools.model_dump(mode="json"), base)
    return digest(parts)
