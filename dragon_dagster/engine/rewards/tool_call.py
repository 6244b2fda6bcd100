"""The tool_call reward (format family): does the completion call the pipeline's tools correctly?

A completion from a rollout with tools in the loop is a conversation (assistant turns with tool_calls, tool
turns, the final answer); score_rows hands it over as row["completion_messages"], and the other rewards read
its final answer. Without one, the completion's text is read for <tool_call> blocks (the fallback format).
The schemas are the pipeline's tools, bound by the worker that has them (`bind_tools`), never written into the
spec: a reward is a check, the tools are the pipeline's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import Field, PrivateAttr

from ..tools.metrics import tool_call_valid
from .base import Number, Reward


class ToolCallReward(Reward):
    """1 when the completion calls tools and every call is valid JSON naming a declared tool with arguments its
    schema accepts; 0 when any call is not; `no_call` when it calls none."""

    family: ClassVar[Literal["accuracy", "format"]] = "format"
    type: Literal["tool_call"] = "tool_call"
    no_call: Number = Field(
        0.0,
        ge=0,
        le=1,
        description="The score of a completion that calls no tool: 0 when every prompt needs a call, higher when "
        "answering without one is fine.",
    )
    _schemas: list[dict] | None = PrivateAttr(None)

    def bind_tools(self, schemas: list[dict]) -> None:
        self._schemas = list(schemas)

    def score(self, completion: str, reference: Any = None, prompt: str = "", row: Mapping | None = None) -> float:
        if self._schemas is None:
            raise self._fail(
                "needs the pipeline's tools: declare `tools:` in the pipeline and set `tools: true` on the stage"
            )
        reply = (row or {}).get("completion_messages") or completion
        valid = tool_call_valid(reply, self._schemas)
        return self.no_call if valid is None else float(valid)
