"""The pipeline's JSON schema as validators use it (`dg check yaml`, editors): pydantic's schema, with every
tagged union (a stage by its kind, a reward by its type) written as if/then on the tag, so an error names the
field of the kind at hand rather than "not valid under any of the given schemas"; and every number allowed as a
string that reads as one, since YAML 1.1 reads `2e-4` as a string (pydantic's lax mode takes it)."""

from __future__ import annotations

from typing import Any

from pydantic import create_model
from pydantic.json_schema import model_json_schema

from .. import catalog


def pipeline_schema(pipeline_cls, *args, **kwargs) -> dict[str, Any]:
    """The schema of pipeline_cls with `stages` as the union of every registered kind's settings model."""
    typed = create_model(pipeline_cls.__name__, __base__=pipeline_cls, stages=(list[catalog.stage_union()], ...))
    schema = model_json_schema(typed, *args, **kwargs)
    schema["properties"]["stages"]["description"] = pipeline_cls.model_fields["stages"].description
    _tags_as_conditions(schema)
    _numbers_as_strings(schema)
    return schema


def _tags_as_conditions(node: Any) -> None:
    """{oneOf: [...], discriminator: {propertyName, mapping}} -> an object whose tag is one of the mapping's keys,
    each `if tag == key then $ref`."""
    if isinstance(node, list):
        for value in node:
            _tags_as_conditions(value)
        return
    if not isinstance(node, dict):
        return
    for value in node.values():
        _tags_as_conditions(value)
    discriminator = node.get("discriminator")
    if isinstance(discriminator, dict) and "mapping" in discriminator and "oneOf" in node:
        tag, mapping = discriminator["propertyName"], discriminator["mapping"]
        node.clear()
        node.update(
            {
                "type": "object",
                "required": [tag],
                "properties": {tag: {"enum": list(mapping)}},
                "allOf": [
                    {"if": {"properties": {tag: {"const": key}}, "required": [tag]}, "then": {"$ref": ref}}
                    for key, ref in mapping.items()
                ],
            }
        )


NUMBER_TEXT = r"^\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*$"


def _numbers_as_strings(node: Any) -> None:
    """Let every number in a schema also be a string that reads as one, as pydantic's lax mode accepts it."""
    if isinstance(node, list):
        for value in node:
            _numbers_as_strings(value)
    elif isinstance(node, dict):
        for value in node.values():
            _numbers_as_strings(value)
        if node.get("type") == "number":
            node.pop("type")
            bounds = {
                k: node.pop(k) for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum") if k in node
            }
            node["anyOf"] = [{"type": "number", **bounds}, {"type": "string", "pattern": NUMBER_TEXT}]
