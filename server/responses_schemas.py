"""Validation of OpenAI Responses request bodies (/v1/responses) into the chat route's own
GenerationSpec.

As for Anthropic's Messages (server/anthropic_schemas.py), the body is translated field by field
into a /v1/chat/completions body and `parse_chat` validates it: one set of checks, one rendering,
one tool grammar. Only what the Responses shape adds is checked here (input items, the
function_call / function_call_output pairing, the flat tool and tool_choice forms, text.format),
and the chat parser's errors are renamed into Responses' field names (`max_tokens` →
`max_output_tokens`, `response_format` → `text.format`, `tools[i].function.parameters` →
`tools[i].parameters`).

Mapping (docs/responses-api.md has the full table):
  instructions                          a leading system message
  input (a string: one user message)    messages: message items by role (developer → system),
                                        function_call items → the assistant's tool_calls,
                                        function_call_output items → `tool` messages
  max_output_tokens                     max_tokens
  tools[] {type: function, name, description, parameters, strict}   chat's function tools
  tool_choice auto | required | none | {type: function, name}       chat's tool_choice
  text.format text | json_object | json_schema {name, schema, ...}  response_format
  temperature, top_p, parallel_tool_calls, stream, service_tier, user, metadata,
  prompt_cache_key, safety_identifier   the chat fields of the same name
  store                                 whether the response is kept (server/responses_routes.py)
  previous_response_id                  the earlier response's items and output, before `input`
                                        (looked up by the route, passed here as `earlier`)
cobatch's extensions pass through as on chat (EXTENSIONS: seed, priority, speculative, ...).
Refused with a 400 naming the field: conversations and item references (nothing is kept but whole
responses), background, built-in tools, non-text parts, reasoning, include, truncation other than
"disabled", unknown item and part types, and a function_call_output whose call_id names no
earlier function_call.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from server.errors import APIError, BadRequest, renamed
from server.openai_schemas import parse_chat
from server.tool_syntax import GENERIC, ToolSyntax
from server.spec import GenerationSpec
from server.tiers import INTERACTIVE
from server.validation import FieldReader

# cobatch's own chat fields, accepted here too (the openai SDK sends them through extra_body).
EXTENSIONS = ("stop", "seed", "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty",
              "logit_bias", "priority", "timeout", "speculative")
# Passed to the chat parser as they are: it reads them under the same names.
SAME_NAMES = ("temperature", "top_p", "parallel_tool_calls", "stream", "service_tier", "user", "metadata",
              "prompt_cache_key", "safety_identifier")
MESSAGE_ROLES = ("user", "system", "developer", "assistant")
TEXT_PARTS = ("input_text", "output_text")
MEDIA_PARTS = ("input_image", "input_file", "input_audio")
NO_STATE = ("this server keeps responses, not conversations or their items: continue a response with "
            "'previous_response_id', or send the whole conversation in 'input'")


@dataclass(frozen=True)
class ResponsesRequest:
    """A validated Responses body: the model, its one choice as the chat route's spec, and the
    request's settings as a response echoes them."""

    model: str
    spec: GenerationSpec
    echo: dict[str, Any] = field(default_factory=dict)
    store: bool | None = None  # as sent: None when the body says nothing
    previous_response_id: str | None = None


def previous_response_id(body: dict[str, Any]) -> str | None:
    """The body's previous_response_id, checked before the route looks it up."""
    value = body.get("previous_response_id")
    if value is not None and (not isinstance(value, str) or not value):
        raise BadRequest("'previous_response_id' must be the id of a stored response (a non-empty string)",
                         param="previous_response_id")
    return value


def parse_responses_body(body: dict[str, Any], *, n_ctx: int, tier: str = INTERACTIVE,
                         earlier: list[dict[str, Any]] = (), tool_syntax: ToolSyntax = GENERIC) -> ResponsesRequest:
    """A /v1/responses body; `tier` for a request that names none (service_tier or priority);
    `earlier`: the items previous_response_id stands for (server/responses_items.py), read
    before `input` as if sent there."""
    fields = FieldReader(body)
    _refuse_what_needs_state(fields)
    previous = previous_response_id(body)
    fields.raw("previous_response_id", None)
    chat: dict[str, Any] = {"model": fields.string("model", non_empty=True)}
    instructions = fields.string("instructions", None, nullable=True)
    chat["messages"] = ([{"role": "system", "content": instructions}] if instructions else []) + _chat_messages(
        fields.raw("input", None), list(earlier))
    max_output_tokens = fields.raw("max_output_tokens", None)
    if max_output_tokens is not None:
        chat["max_tokens"] = max_output_tokens
    tools = _chat_tools(fields.raw("tools", None))
    if tools is not None:
        chat["tools"] = tools
    if fields.present("tool_choice"):
        chat["tool_choice"] = _chat_tool_choice(fields.raw("tool_choice"))
    response_format = _response_format(fields.raw("text", None))
    if response_format is not None:
        chat["response_format"] = response_format
    for name in (*SAME_NAMES, *EXTENSIONS):
        if fields.present(name):
            chat[name] = fields.raw(name)
    store = fields.boolean("store", None, nullable=True)
    fields.finish()
    try:
        parsed = parse_chat(chat, n_ctx=n_ctx, tier=tier, tool_syntax=tool_syntax)
    except APIError as exc:
        raise in_responses_terms(exc) from None
    echo = {"instructions": instructions, "max_output_tokens": max_output_tokens,
            "metadata": chat.get("metadata") or {}, "tools": [_flat_tool(t) for t in tools or []],
            "tool_choice": _echoed_tool_choice(chat.get("tool_choice")),
            "text": {"format": _echoed_format(response_format)}, "previous_response_id": previous}
    return ResponsesRequest(parsed.model, parsed.specs[0], echo, store, previous)


def _refuse_what_needs_state(fields: FieldReader) -> None:
    """Fields that ask for what this server does not keep or do, refused before anything else."""
    if fields.raw("conversation", None) is not None:
        raise BadRequest(f"'conversation' is not supported: {NO_STATE}", param="conversation")
    if fields.raw("background", None) not in (None, False):
        raise BadRequest("'background' is not supported: responses are answered while the request waits "
                         "(stream it, or send it as a batch job: /v1/batches)", param="background")
    reasoning = fields.raw("reasoning", None)
    if reasoning is not None and (not isinstance(reasoning, dict) or reasoning.get("effort") not in (None, "none")
                                  or set(reasoning) - {"effort", "summary"} or reasoning.get("summary") is not None):
        raise BadRequest("'reasoning' is not supported: this model does not reason before answering (send no "
                         "'reasoning', or {\"effort\": \"none\"})", param="reasoning")
    if fields.raw("include", None) not in (None, []):
        raise BadRequest("'include' is not supported: a response here has no extra outputs to include (no "
                         "reasoning, searches or logprobs)", param="include")
    if fields.raw("truncation", None) not in (None, "disabled"):
        raise BadRequest("'truncation' other than \"disabled\" is not supported: an input longer than the context "
                         "is refused, never cut", param="truncation")


def _chat_messages(value: Any, earlier: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(value, str):
        value = [{"role": "user", "content": value}]
    elif not isinstance(value, list) or not value:
        raise BadRequest("'input' must be a string or a non-empty list of input items", param="input")
    out: list[dict[str, Any]] = []
    call_ids: set[str] = set()
    # Errors name the request's own input items; the earlier ones were read once already.
    places = [f"previous_response_id's item {i}" for i in range(len(earlier))] + [
        f"input[{i}]" for i in range(len(value))]
    for where, item in zip(places, [*earlier, *value]):
        if not isinstance(item, dict):
            raise BadRequest(f"'{where}' must be an input item (an object)", param=where)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            out.append(_message(item, where))
        elif kind == "function_call":
            _append_call(out, item, where, call_ids)
        elif kind == "function_call_output":
            out.append(_call_output(item, where, call_ids))
        elif kind == "item_reference":
            raise BadRequest(f"'{where}' is an item reference: {NO_STATE}", param=f"{where}.type")
        elif kind is None:
            raise BadRequest(f"'{where}' must have a 'type' (or a 'role', for a message)", param=where)
        else:
            raise BadRequest(f"'{where}.type' {kind!r} is not an input item this server reads (items here: message, "
                             "function_call, function_call_output)", param=f"{where}.type")
    return out


def _message(item: dict[str, Any], where: str) -> dict[str, Any]:
    fields = FieldReader(item, where=f"{where}.")
    fields.raw("type")
    fields.string("id", None, nullable=True)  # an earlier output's ids and status, sent back as they were
    fields.string("status", None, nullable=True)
    role = fields.string("role", choices=MESSAGE_ROLES)
    content = fields.raw("content", None)
    fields.finish()
    if isinstance(content, list):
        content = "".join(_text_part(part, f"{where}.content[{j}]") for j, part in enumerate(content))
    elif not isinstance(content, str):
        raise BadRequest(f"'{where}.content' must be a string or a list of text parts", param=f"{where}.content")
    return {"role": "system" if role == "developer" else role, "content": content}


def _text_part(part: Any, at: str) -> str:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind in MEDIA_PARTS:
        raise BadRequest(f"'{at}.type' {kind!r} is not supported: this model reads text only", param=f"{at}.type")
    if kind not in TEXT_PARTS:
        raise BadRequest(f"'{at}' must be a text part ({{\"type\": \"input_text\" | \"output_text\", \"text\": "
                         f"...}}), got {kind!r}", param=f"{at}.type" if isinstance(part, dict) else at)
    fields = FieldReader(part, where=f"{at}.")
    fields.raw("type")
    text = fields.string("text")
    if kind == "output_text":  # what an earlier answer's text part carries, sent back as it was
        fields.raw("annotations", None)
        fields.raw("logprobs", None)
    fields.finish()
    return text


def _append_call(out: list[dict[str, Any]], item: dict[str, Any], where: str, call_ids: set[str]) -> None:
    """A function_call joins the assistant message just before it (its text, or its other calls)."""
    fields = FieldReader(item, where=f"{where}.")
    fields.raw("type")
    fields.string("id", None, nullable=True)
    fields.string("status", None, nullable=True)
    call_id = fields.string("call_id", non_empty=True)
    name = fields.string("name", non_empty=True)
    # Kept as sent: the grammar wrote it so, and the same text lets the prefix cache match.
    arguments = fields.string("arguments")
    fields.finish()
    call_ids.add(call_id)
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    if out and out[-1]["role"] == "assistant":
        out[-1].setdefault("tool_calls", []).append(call)
    else:
        out.append({"role": "assistant", "content": None, "tool_calls": [call]})


def _call_output(item: dict[str, Any], where: str, call_ids: set[str]) -> dict[str, Any]:
    fields = FieldReader(item, where=f"{where}.")
    fields.raw("type")
    fields.string("id", None, nullable=True)
    fields.string("status", None, nullable=True)
    call_id = fields.string("call_id", non_empty=True)
    output = fields.raw("output", None)
    fields.finish()
    if call_id not in call_ids:
        raise BadRequest(f"'{where}.call_id' {call_id!r} names no earlier function_call item in 'input'",
                         param=f"{where}.call_id")
    if isinstance(output, list):
        output = "".join(_text_part(part, f"{where}.output[{k}]") for k, part in enumerate(output))
    elif not isinstance(output, str):
        raise BadRequest(f"'{where}.output' must be a string or a list of text parts", param=f"{where}.output")
    return {"role": "tool", "tool_call_id": call_id, "content": output}


def _chat_tools(value: Any) -> list[dict[str, Any]] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise BadRequest("'tools' must be a list of function tools ({\"type\": \"function\", \"name\", "
                         "\"parameters\"})", param="tools")
    out = []
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise BadRequest(f"'{where}' must be an object with 'type', 'name' and 'parameters'", param=where)
        if tool.get("type") != "function":
            raise BadRequest(f"'{where}.type' {tool.get('type')!r} is not supported: built-in tools run on OpenAI's "
                             "servers; only function tools are supported here", param=f"{where}.type")
        fields = FieldReader(tool, where=f"{where}.")
        fields.raw("type")
        function = {"name": fields.raw("name", None), "parameters": fields.raw("parameters", None)}
        if function["parameters"] is None:  # Responses allows a function without parameters
            function["parameters"] = {"type": "object", "properties": {}}
        for name in ("description", "strict"):
            value = fields.raw(name, None)
            if value is not None:
                function[name] = value
        fields.finish()
        out.append({"type": "function", "function": function})
    return out


def _chat_tool_choice(value: Any) -> Any:
    if value is None or isinstance(value, str):
        return value  # auto | required | none: the chat parser names any other string
    if not isinstance(value, dict) or value.get("type") != "function":
        raise BadRequest("'tool_choice' must be \"auto\", \"required\", \"none\" or {\"type\": \"function\", "
                         "\"name\": ...}", param="tool_choice")
    fields = FieldReader(value, where="tool_choice.")
    fields.raw("type")
    name = fields.string("name", non_empty=True)
    fields.finish()
    return {"type": "function", "function": {"name": name}}


def _response_format(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise BadRequest("'text' must be an object ({\"format\": ...})", param="text")
    fields = FieldReader(value, where="text.")
    form = fields.object("format", None, nullable=True)
    verbosity = fields.string("verbosity", None, nullable=True)
    fields.finish()
    if verbosity not in (None, "medium"):
        raise BadRequest("'text.verbosity' other than \"medium\" is not supported by this engine",
                         param="text.verbosity")
    if form is None:
        return None
    if form.get("type") != "json_schema":
        return form  # text | json_object: the chat parser reads them as they are
    schema = {k: v for k, v in form.items() if k != "type"}
    return {"type": "json_schema", "json_schema": schema}


def _flat_tool(tool: dict[str, Any]) -> dict[str, Any]:
    function = tool["function"]
    return {"type": "function", "name": function["name"], "description": function.get("description"),
            "parameters": function["parameters"], "strict": function.get("strict")}


def _echoed_tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict):
        return {"type": "function", "name": choice["function"]["name"]}
    return choice or "auto"


def _echoed_format(response_format: dict[str, Any] | None) -> dict[str, Any]:
    if response_format is None:
        return {"type": "text"}
    if response_format["type"] == "json_schema":
        return {"type": "json_schema", **response_format["json_schema"]}
    return response_format


# The chat parser's field names, and Responses' for them (a message quotes the names it cites).
_RENAMES = [
    (re.compile(r"tools\[(\d+)\]\.function\.(parameters|name|description|strict)"), r"tools[\1].\2"),
    (re.compile(r"tools\[(\d+)\]\.function\b"), r"tools[\1]"),
    (re.compile(r"tool_choice\.function\.name"), "tool_choice.name"),
    (re.compile(r"\bmax_tokens\b"), "max_output_tokens"),
    (re.compile(r"'response_format(\.json_schema)?"), "'text.format"),
    (re.compile(r"'messages(\[\d+\])?"), "'input"),  # the chat's message indices are not the input's
]


def in_responses_terms(error: APIError) -> APIError:
    """`error`, raised by the chat route's checks, with the Responses API's field names."""
    return renamed(error, _RENAMES)
