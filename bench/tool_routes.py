"""The same tool requests through each API dialect: chat completions, Responses and Messages.

`cobatch bench tools` builds every request once, as a chat body; a Route translates it into its
own dialect (the same conversation, tools, tool_choice, max tokens, temperature and seed) and
reads the answer back into one shape, so a single judge counts complete and valid calls on every
route and every server. A seed a dialect does not define is sent as cobatch's extension field;
a server that does not read it (llama-server's Messages route) samples without it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Answer:
    """One answer, whatever its dialect."""

    calls: list[tuple[str, Any]] | None  # (name, arguments: JSON text, or the object); None: no calls at all
    text: str | None  # None: the dialect's text field was not a string
    ended_with_calls: bool  # the dialect's own word that the answer is its calls (finish_reason, status, stop_reason)
    finish: str  # that word, for the report


@dataclass(frozen=True)
class Route:
    name: str
    path: str
    body: Callable[[dict[str, Any], str], dict[str, Any]]  # (chat body, model) -> this route's body
    read: Callable[[dict[str, Any]], Answer]


def _chat_body(chat: dict[str, Any], model: str) -> dict[str, Any]:
    return {"model": model, **chat}


def _chat_read(payload: dict[str, Any]) -> Answer:
    choice = payload["choices"][0]
    message = choice.get("message") or {}
    calls = message.get("tool_calls")
    return Answer(None if calls is None else [((c.get("function") or {}).get("name"),
                                               (c.get("function") or {}).get("arguments", "")) for c in calls],
                  message.get("content"), choice.get("finish_reason") == "tool_calls", str(choice.get("finish_reason")))


def _responses_body(chat: dict[str, Any], model: str) -> dict[str, Any]:
    choice = chat["tool_choice"]
    if isinstance(choice, dict):
        choice = {"type": "function", "name": choice["function"]["name"]}
    return {"model": model, "input": chat["messages"], "store": False,
            "tools": [{"type": "function", **t["function"]} for t in chat["tools"]], "tool_choice": choice,
            "max_output_tokens": chat["max_tokens"], "temperature": chat["temperature"], "seed": chat["seed"]}


def _responses_read(payload: dict[str, Any]) -> Answer:
    output = payload.get("output") or []
    calls = [(o.get("name"), o.get("arguments", "")) for o in output if o.get("type") == "function_call"]
    text = "".join(part.get("text", "") for o in output if o.get("type") == "message"
                   for part in o.get("content") or [] if part.get("type") == "output_text")
    status = str(payload.get("status"))
    reason = (payload.get("incomplete_details") or {}).get("reason")
    # An empty answer has no output items: its text is "".
    return Answer(calls or None, text, status == "completed" and bool(calls), status + (f" ({reason})" if reason else ""))


def _messages_body(chat: dict[str, Any], model: str) -> dict[str, Any]:
    choice = chat["tool_choice"]
    kind = {"required": {"type": "any"}, "auto": {"type": "auto"}, "none": {"type": "none"}}
    return {"model": model, "messages": chat["messages"], "max_tokens": chat["max_tokens"],
            "tools": [{"name": t["function"]["name"], "description": t["function"].get("description", ""),
                       "input_schema": t["function"].get("parameters") or {"type": "object"}} for t in chat["tools"]],
            "tool_choice": ({"type": "tool", "name": choice["function"]["name"]} if isinstance(choice, dict)
                            else kind[choice]),
            "temperature": min(1.0, chat["temperature"]), "seed": chat["seed"]}  # Anthropic's range is 0..1


def _messages_read(payload: dict[str, Any]) -> Answer:
    blocks = payload.get("content") or []
    calls = [(b.get("name"), b.get("input")) for b in blocks if b.get("type") == "tool_use"]
    texts = [b.get("text", "") for b in blocks if b.get("type") == "text"]
    reason = str(payload.get("stop_reason"))
    return Answer(calls or None, "".join(texts), reason == "tool_use" and bool(calls), reason)


ROUTES = {
    "chat": Route("chat", "/v1/chat/completions", _chat_body, _chat_read),
    "responses": Route("responses", "/v1/responses", _responses_body, _responses_read),
    "messages": Route("messages", "/v1/messages", _messages_body, _messages_read),
}
