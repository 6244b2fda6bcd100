"""The OpenAI chat protocol as its clients use it: the request (unknown fields ignored, as OpenAI's API does),
the response and stream chunks, and errors in OpenAI's shape ({"error": {"message", "type", "param", "code"}})."""

from __future__ import annotations

import json
import time
from typing import Any, Literal

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator


class ServeError(Exception):
    """A request refused with an OpenAI-shaped error and its HTTP status."""

    TYPES = {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        413: "invalid_request_error",
        429: "rate_limit_exceeded",
        503: "service_unavailable",
        500: "server_error",
        504: "timeout",
    }

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.TYPES.get(self.status, "invalid_request_error"),
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


class Loose(BaseModel):
    model_config = ConfigDict(extra="ignore")


class FunctionCall(Loose):
    name: str
    arguments: str | dict = "{}"


class ToolCall(Loose):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(Loose):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        """The content as text: OpenAI's content parts joined (only text parts: this server reads no images)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for part in self.content:
            if part.get("type") != "text":
                raise ServeError(
                    400,
                    f"content parts of type {part.get('type')!r} are not supported: send text",
                    "messages",
                    "unsupported_content",
                )
            parts.append(str(part.get("text", "")))
        return "".join(parts)

    def as_turn(self) -> dict:
        """The message as the chat template and the feedback store read it."""
        role = "system" if self.role == "developer" else self.role
        turn: dict[str, Any] = {"role": role, "content": self.text()}
        if self.tool_calls:
            turn["tool_calls"] = [
                {
                    "type": "function",
                    "function": {"name": c.function.name, "arguments": _arguments(c.function.arguments)},
                }
                for c in self.tool_calls
            ]
        if self.role == "tool" and self.name:
            turn["name"] = self.name
        return turn


def _arguments(value: str | dict) -> dict:
    if isinstance(value, dict):
        return value
    try:
        parsed = json.loads(value or "{}")
    except json.JSONDecodeError as exc:
        raise ServeError(400, f"a tool call's arguments are not JSON: {exc}", "messages", "invalid_tool_call") from None
    return parsed if isinstance(parsed, dict) else {"value": parsed}


class StreamOptions(Loose):
    include_usage: bool = False


class ChatRequest(Loose):
    model: str
    messages: list[Message] = Field(min_length=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int | None = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    user: str | None = None

    @field_validator("n")
    @classmethod
    def _one(cls, value):
        if value not in (None, 1):
            raise ValueError("only n=1 is supported: send one request per reply")
        return value

    @field_validator("stop")
    @classmethod
    def _stops(cls, value):
        stops = [value] if isinstance(value, str) else list(value or [])
        if len(stops) > 4:
            raise ValueError("at most 4 stop sequences")
        return stops

    def turns(self) -> list[dict]:
        return [m.as_turn() for m in self.messages]

    def tool_schemas(self) -> list[dict] | None:
        """The tools the template renders: none when tool_choice is "none"; only the named one when it names one."""
        if not self.tools or self.tool_choice == "none":
            return None
        if isinstance(self.tool_choice, dict):
            name = (self.tool_choice.get("function") or {}).get("name")
            chosen = [t for t in self.tools if (t.get("function") or {}).get("name") == name]
            if not chosen:
                raise ServeError(400, f"tool_choice names {name!r}, which is not among tools", "tool_choice")
            return chosen
        return self.tools


def validation_error(exc) -> ServeError:
    """pydantic's first error as OpenAI's 400: the field as `param`."""
    first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": str(exc)}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    message = str(first.get("msg", "invalid request")).removeprefix("Value error, ")
    return ServeError(400, f"{'.'.join(loc) or 'request'}: {message}", loc[0] if loc else None, "invalid_value")


def completion(id_: str, model: str, text: str, tool_calls: list[dict], finish: str, usage: dict) -> dict:
    message: dict[str, Any] = {"role": "assistant", "content": text if (text or not tool_calls) else None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "id": id_,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": usage,
    }


def chunk(
    id_: str, model: str, delta: dict, finish: str | None = None, usage: dict | None = None, choices: bool = True
) -> str:
    body = {
        "id": id_,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}] if choices else [],
    }
    if usage is not None:
        body["usage"] = usage
    return f"data: {json.dumps(body)}\n\n"


def usage(prompt: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion_tokens, "total_tokens": prompt + completion_tokens}
