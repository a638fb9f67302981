"""A request's input as the Responses API lists its items (GET /v1/responses/{id}/input_items),
and what a `previous_response_id` stands for.

Each input item is listed as OpenAI returns it: with an id (the client's, or a new one), a
status, and its content as parts (a string content becomes one `input_text` part, or
`output_text` for an assistant's). Listed items are valid input items themselves, so a
continuation reads them again through the same parser: the earlier response's items, then its
output items as they were answered, then the new input. The same messages in the same order
render the same prompt bytes as the earlier turn plus its answer, which is what lets the prefix
cache serve them.
"""
from __future__ import annotations

import uuid
from typing import Any

from server.responses_store import StoredResponse


def listed_items(value: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The items of a validated `input` (server/responses_schemas.py has read it) as listed."""
    if isinstance(value, str):
        value = [{"role": "user", "content": value}]
    return [_listed(item) for item in value]


def continued_items(previous: StoredResponse) -> list[dict[str, Any]]:
    """What `previous_response_id` stands for: the earlier response's whole context, then its output."""
    return [*previous.items, *previous.response.get("output", [])]


def _listed(item: dict[str, Any]) -> dict[str, Any]:
    kind = item.get("type", "message")
    status = item.get("status") or "completed"
    if kind == "message":
        role = item["role"]
        part = "output_text" if role == "assistant" else "input_text"
        content = item["content"]
        texts = [content] if isinstance(content, str) else [p["text"] for p in content]
        parts = [{"type": part, "text": text, **({"annotations": []} if part == "output_text" else {})}
                 for text in texts]
        return {"id": item.get("id") or _new_id("msg"), "type": "message", "role": role, "status": status,
                "content": parts}
    if kind == "function_call":
        return {"id": item.get("id") or _new_id("fc"), "type": kind, "call_id": item["call_id"],
                "name": item["name"], "arguments": item["arguments"], "status": status}
    return {"id": item.get("id") or _new_id("fco"), "type": kind, "call_id": item["call_id"],
            "output": item["output"], "status": status}


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"
