"""A conversation as a backend takes it: chat messages parsed into their one form, a system prompt put first.

A conversation is a list of chat messages ({"role": ..., "content": ...}, roles as data/conversations.Role) or a
plain string (one user message). An assistant turn's tool_calls and a tool turn's name and tool_call_id are kept
beside role and content for a backend that renders tools; other keys are dropped. Framework-free.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from ..data.conversations import ROLES, Role

TURN_KEYS = {"assistant": ("tool_calls",), "tool": ("name", "tool_call_id")}  # kept beside role and content


class ConversationError(ValueError):
    """A conversation that is not a non-empty list of chat messages (or a string)."""


class ChatMessage(BaseModel):
    """One chat message: a role, a content (whatever the caller gives: a backend sends it on as it is), and the
    tool keys of its role."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    role: Role
    content: Any
    tool_calls: Any = None
    name: Any = None
    tool_call_id: Any = None

    def as_dict(self, tool_keys: bool = True) -> dict:
        """The message as a chat template and a server take it: role and content, and (tool_keys) the tool keys
        of its role that are set."""
        message = {"role": self.role, "content": self.content}
        for key in TURN_KEYS.get(self.role, ()) if tool_keys else ():
            if getattr(self, key):
                message[key] = getattr(self, key)
        return message


def as_conversation(item: Any, tool_keys: bool = True) -> list[dict]:
    """A conversation as a list of {"role", "content"} dicts (with tool_keys, an assistant turn's tool_calls and
    a tool turn's name and tool_call_id kept); a plain string is one user message."""
    if isinstance(item, str):
        return [{"role": "user", "content": item}]
    if not isinstance(item, (list, tuple)) or not item:
        raise ConversationError(
            f"a conversation must be a non-empty list of chat messages or a string, got {item!r:.200}"
        )
    messages = []
    for message in item:
        try:
            messages.append(ChatMessage.model_validate(message).as_dict(tool_keys))
        except ValidationError:
            raise ConversationError(
                f"a chat message must be a dict with a role in {ROLES} and a content, got {message!r:.200}"
            ) from None
    return messages


def with_system(conversation: list[dict], system: str | None) -> list[dict]:
    """The conversation with `system` as its first message; a system message already there is replaced
    (several system turns break many chat templates)."""
    if not system:
        return conversation
    rest = conversation[1:] if conversation and conversation[0]["role"] == "system" else conversation
    return [{"role": "system", "content": system}] + rest
