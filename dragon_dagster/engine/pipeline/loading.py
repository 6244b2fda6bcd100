"""Reading a pipeline's YAML: the component's defs.yaml (its `attributes:`) or a bare pipeline mapping, every
problem named with its field and line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from .definition import Pipeline, PipelineError
from .errors import describe


def _node_lines(node, path=()) -> dict[tuple, int]:
    """Line of every mapping key and list item in a YAML node tree, by its path."""
    found = {path: node.start_mark.line + 1}
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            found.update(_node_lines(value, (*path, key.value)))
            found[(*path, key.value)] = key.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            found.update(_node_lines(item, (*path, i)))
    return found


def parse(data: Any, source_file: str | Path | None = None, lines: dict[tuple, int] | None = None) -> Pipeline:
    where = str(source_file or "pipeline")
    try:
        pipeline = Pipeline.model_validate(data)
    except ValidationError as exc:
        raise PipelineError(f"{where}: {describe(exc, lines)}") from None
    return pipeline.located(source_file)


def load(path: str | Path) -> Pipeline:
    """A pipeline from a YAML file: a component's defs.yaml (its `attributes:`) or a bare pipeline mapping."""
    path = Path(path)
    try:
        text = path.read_text()
        data, root = yaml.safe_load(text), yaml.compose(text)
    except yaml.YAMLError as exc:
        raise PipelineError(f"{path}: not valid YAML: {exc}") from exc
    lines = _node_lines(root) if root is not None else {}
    if isinstance(data, dict) and "attributes" in data and "type" in data:
        data = data["attributes"]
        lines = {k[1:]: v for k, v in lines.items() if k[:1] == ("attributes",)}
    return parse(data, path, lines)
