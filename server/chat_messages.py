"""Chat messages as the OpenAI routes accept them: roles, text content, earlier tool calls and
tool results."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from server.errors import BadRequest
from server.validation import FieldReader

ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass(frozen=True)
class ToolCallRecord:
    """An earlier call, as the client sends it back in an assistant message."""
    id: str
    name: str
    arguments: str  # JSON text, echoed verbatim


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str
    tool_calls: tuple[ToolCallRecord, ...] = ()  # assistant messages only
    tool_call_id: str | None = None  # tool messages only
    name: str | None = None


def parse_messages(value: Any) -> list[ChatMessage]:
    if not isinstance(value, list) or not value:
        raise BadRequest("'messages' must be a non-empty list of messages", param="messages")
    messages = []
    for i, item in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(item, dict):
            raise BadRequest(f"'{where}' must be an object with 'role' and 'content'", param="messages")
        fields = FieldReader(item, where=f"{where}.")
        role = fields.string("role", choices=ROLES)
        raw_content = fields.raw("content", None)
        calls = _tool_calls(fields.raw("tool_calls", None), where) if role == "assistant" else ()
        # An assistant message that calls tools may have no content (OpenAI sends null).
        content = "" if raw_content is None and calls else _content_text(raw_content, where)
        if role == "tool":
            call_id = fields.string("tool_call_id", non_empty=True)  # which call this answers
        elif fields.present("tool_call_id"):
            raise BadRequest(f"'{where}.tool_call_id' belongs to messages with role 'tool'", param="messages")
        else:
            call_id = None
        if fields.present("tool_calls"):
            raise BadRequest(f"'{where}.tool_calls' belongs to assistant messages", param="messages")
        name = fields.string("name", None, nullable=True)  # accepted for compatibility
        fields.finish()
        messages.append(ChatMessage(role, content, calls, call_id, name))
    if not any(m.role == "user" for m in messages):
        raise BadRequest("'messages' must contain at least one user message", param="messages")
    return messages


def _tool_calls(value: Any, where: str) -> tuple[ToolCallRecord, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise BadRequest(f"'{where}.tool_calls' must be a list", param="messages")
    calls = []
    for j, call in enumerate(value):
        at = f"{where}.tool_calls[{j}]"
        fn = call.get("function") if isinstance(call, dict) else None
        if (not isinstance(call, dict) or call.get("type", "function") != "function" or not isinstance(fn, dict)
                or not isinstance(call.get("id"), str) or not isinstance(fn.get("name"), str)
                or not isinstance(fn.get("arguments"), str)):
            raise BadRequest(f"'{at}' must be {{\"id\": ..., \"type\": \"function\", \"function\": "
                             "{\"name\": ..., \"arguments\": \"<JSON text>\"}}", param="messages")
        calls.append(ToolCallRecord(call["id"], fn["name"], fn["arguments"]))
    return tuple(calls)


def _content_text(content: Any, where: str) -> str:
    """OpenAI allows a string or a list of parts; only text parts mean anything to this model."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise BadRequest(
                    f"'{where}.content[{j}]' must be {{\"type\": \"text\", \"text\": ...}}: "
                    "this model reads text only",
                    param="messages",
                )
            texts.append(part["text"])
        return "".join(texts)
    raise BadRequest(f"'{where}.content' must be a string or a list of text parts", param="messages")
