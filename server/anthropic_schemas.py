"""Validation of Anthropic Messages request bodies (/v1/messages, /v1/messages/count_tokens) into
the chat route's own GenerationSpec.

The body is translated field by field into a /v1/chat/completions body, which `parse_chat`
validates as it validates every chat: one set of checks, one rendering, one tool grammar. Only
what Anthropic's shape adds is checked here (blocks, tool_use/tool_result pairing, tool_choice's
form, temperature's range 0..1), and the chat parser's errors are renamed into Anthropic's field
names (`stop` → `stop_sequences`, `tools[i].function.parameters` → `tools[i].input_schema`).

Mapping (docs/messages-api.md has the full table):
  system (string or text blocks)        a system message
  messages[].content text blocks        the message's text; tool_result blocks in a user message
                                        become `tool` messages (is_error: "Error: " before the
                                        text), tool_use blocks in an assistant message its calls
                                        (input written as compact JSON)
  max_tokens (required), temperature, top_p, top_k, stream   the chat fields of the same name
  stop_sequences                        stop
  tools[] {name, description, input_schema}   functions {name, description, parameters}
  tool_choice auto | any | tool | none  auto | required | the named function | none;
                                        disable_parallel_tool_use → parallel_tool_calls false
  output_config.format {type: json_schema, schema}   response_format json_schema (beside tools
                                        with tool_choice auto: what an answer without calls follows)
  metadata, service_tier (auto | standard_only), cache_control (top level, blocks, tools)   read, unused
                                        (the route's tier; the prefix cache needs no breakpoints)
cobatch's extensions pass through as on chat (EXTENSIONS: seed, priority, speculative, ...).
Refused with a 400 naming the field: image and document blocks, thinking (but "disabled"),
server tools, unknown block types, a tool_result whose tool_use_id names no earlier tool_use,
and a last assistant message (prefill: the answer always starts a new turn here).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from server.errors import APIError, BadRequest, renamed
from server.openai_schemas import parse_chat
from server.tool_syntax import GENERIC, ToolSyntax
from server.spec import GenerationSpec
from server.tiers import INTERACTIVE
from server.validation import FieldReader

ANTHROPIC_SERVICE_TIERS = ("auto", "standard_only")  # neither names a tier of ours: the route's default
MAX_TEMPERATURE = 1.0  # Anthropic's range is 0..1 (the chat route's goes to 2)
# cobatch's own chat fields, accepted here too (the anthropic SDK sends them through extra_body).
EXTENSIONS = ("seed", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "logit_bias",
              "priority", "timeout", "speculative")
SAMPLING = ("temperature", "top_p", "top_k")
TEXT_ONLY_BLOCKS = ("image", "document", "search_result", "container_upload")
THINKING_BLOCKS = ("thinking", "redacted_thinking")


@dataclass(frozen=True)
class MessagesRequest:
    """A validated Messages body: the model it names and its one choice as the chat route's spec."""

    model: str
    spec: GenerationSpec


def parse_messages_body(body: dict[str, Any], *, n_ctx: int, tier: str = INTERACTIVE,
                        tool_syntax: ToolSyntax = GENERIC) -> MessagesRequest:
    """A /v1/messages body; `tier` for a request that names none (cobatch's `priority` does)."""
    fields = FieldReader(body)
    chat = _conversation(fields)
    chat["max_tokens"] = fields.integer("max_tokens", minimum=1)
    if fields.present("stop_sequences"):
        stops = fields.raw("stop_sequences")
        if stops is not None and not isinstance(stops, list):
            raise BadRequest("'stop_sequences' must be a list of strings", param="stop_sequences")
        chat["stop"] = stops
    chat["temperature"] = fields.number("temperature", None, minimum=0.0, maximum=MAX_TEMPERATURE, nullable=True)
    for name in (*SAMPLING[1:], "stream", *EXTENSIONS):
        if fields.present(name):
            chat[name] = fields.raw(name)
    fields.object("metadata", None, nullable=True)
    fields.string("service_tier", None, choices=ANTHROPIC_SERVICE_TIERS, nullable=True)
    response_format = _output_format(fields.raw("output_config", None))
    if response_format is not None:
        chat["response_format"] = response_format
    fields.finish()
    return _as_chat(chat, n_ctx=n_ctx, tier=tier, tool_syntax=tool_syntax)


def parse_count_tokens_body(body: dict[str, Any], *, n_ctx: int, tool_syntax: ToolSyntax = GENERIC) -> MessagesRequest:
    """A /v1/messages/count_tokens body: what shapes the prompt (model, system, messages, tools,
    tool_choice), counted as /v1/messages would render it."""
    fields = FieldReader(body)
    chat = _conversation(fields)
    _output_format(fields.raw("output_config", None))  # checked; the format does not change the prompt
    fields.finish()
    return _as_chat(chat, n_ctx=n_ctx, tier=INTERACTIVE, tool_syntax=tool_syntax)


def _conversation(fields: FieldReader) -> dict[str, Any]:
    """The fields that make the prompt, as a chat body."""
    _refuse_thinking(fields.raw("thinking", None))
    fields.object("cache_control", None, nullable=True)  # the prefix cache needs no breakpoint
    chat: dict[str, Any] = {"model": fields.string("model", non_empty=True)}
    system = _system_text(fields.raw("system", None))
    chat["messages"] = ([{"role": "system", "content": system}] if system else []) + _chat_messages(
        fields.raw("messages", None))
    tools = _chat_tools(fields.raw("tools", None))
    choice, parallel = _chat_tool_choice(fields.raw("tool_choice", None))
    if tools is not None:
        chat["tools"] = tools
    if choice is not None:
        chat["tool_choice"] = choice
    if parallel is not None:
        chat["parallel_tool_calls"] = parallel
    return chat


def _as_chat(chat: dict[str, Any], *, n_ctx: int, tier: str, tool_syntax: ToolSyntax) -> MessagesRequest:
    try:
        parsed = parse_chat(chat, n_ctx=n_ctx, tier=tier, tool_syntax=tool_syntax)
    except APIError as exc:
        raise in_anthropic_terms(exc) from None
    return MessagesRequest(parsed.model, parsed.specs[0])


def _output_format(value: Any) -> dict[str, Any] | None:
    """`output_config` ({format: {type: "json_schema", schema}}, effort absent or null) as the
    chat route's response_format (None: no format)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise BadRequest("'output_config' must be an object", param="output_config")
    fields = FieldReader(value, where="output_config.")
    if fields.raw("effort", None) is not None:
        raise BadRequest("'output_config.effort' is not supported: this model has no effort setting",
                         param="output_config.effort")
    form = fields.object("format", None, nullable=True)
    fields.finish()
    if form is None:
        return None
    fields = FieldReader(form, where="output_config.format.")
    fields.string("type", choices=("json_schema",))
    schema = fields.object("schema")
    fields.finish()
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}


def _refuse_thinking(value: Any) -> None:
    if value is None or value == {"type": "disabled"}:
        return
    raise BadRequest("'thinking' is not supported: this model has no extended thinking (send no 'thinking', or "
                     "{\"type\": \"disabled\"})", param="thinking")


def _system_text(value: Any) -> str:
    if value is None or isinstance(value, str):
        return value or ""
    if not isinstance(value, list):
        raise BadRequest("'system' must be a string or a list of text blocks", param="system")
    return "".join(_text_block(block, f"system[{j}]") for j, block in enumerate(value))


def _chat_messages(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise BadRequest("'messages' must be a non-empty list of messages", param="messages")
    out: list[dict[str, Any]] = []
    tool_use_ids: set[str] = set()
    for i, item in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(item, dict):
            raise BadRequest(f"'{where}' must be an object with 'role' and 'content'", param=where)
        fields = FieldReader(item, where=f"{where}.")
        role = fields.string("role", choices=("user", "assistant"))
        content = fields.raw("content", None)
        fields.finish()
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        elif not isinstance(content, list) or not content:
            raise BadRequest(f"'{where}.content' must be a string or a non-empty list of content blocks",
                             param=f"{where}.content")
        if role == "assistant":
            out.append(_assistant_message(content, where, tool_use_ids))
        else:
            out += _user_messages(content, where, tool_use_ids)
    if value[-1].get("role") == "assistant":
        raise BadRequest(f"'messages[{len(value) - 1}]' is an assistant message: prefilling the answer is not "
                         "supported here (the answer is always a new turn); end with a user message",
                         param=f"messages[{len(value) - 1}]")
    return out


def _assistant_message(blocks: list[Any], where: str, tool_use_ids: set[str]) -> dict[str, Any]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        if _block_type(block, at, allowed=("text", "tool_use")) == "text":
            texts.append(_text_block(block, at))
            continue
        fields = FieldReader(block, where=f"{at}.")
        fields.raw("type")
        call_id = fields.string("id", non_empty=True)
        name = fields.string("name", non_empty=True)
        arguments = fields.object("input")
        fields.object("cache_control", None, nullable=True)
        fields.finish()
        tool_use_ids.add(call_id)
        # Compact, in the client's key order: how the grammar wrote it, so the prefix cache matches.
        calls.append({"id": call_id, "type": "function", "function": {
            "name": name, "arguments": json.dumps(arguments, separators=(",", ":"), ensure_ascii=False)}})
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts or not calls else None}
    if calls:
        message["tool_calls"] = calls
    return message


def _user_messages(blocks: list[Any], where: str, tool_use_ids: set[str]) -> list[dict[str, Any]]:
    """Text blocks in a row make one user message; each tool_result is a tool message of its own."""
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        if _block_type(block, at, allowed=("text", "tool_result")) == "text":
            texts.append(_text_block(block, at))
            continue
        if texts:
            out.append({"role": "user", "content": "".join(texts)})
            texts = []
        out.append(_tool_result(block, at, tool_use_ids))
    if texts:
        out.append({"role": "user", "content": "".join(texts)})
    return out


def _tool_result(block: dict[str, Any], at: str, tool_use_ids: set[str]) -> dict[str, Any]:
    fields = FieldReader(block, where=f"{at}.")
    fields.raw("type")
    call_id = fields.string("tool_use_id", non_empty=True)
    content = fields.raw("content", "")
    is_error = fields.boolean("is_error", False, nullable=True)
    fields.object("cache_control", None, nullable=True)
    fields.finish()
    if call_id not in tool_use_ids:
        raise BadRequest(f"'{at}.tool_use_id' {call_id!r} names no tool_use block of an earlier assistant message",
                         param=f"{at}.tool_use_id")
    if isinstance(content, list):
        content = "".join(_text_block(part, f"{at}.content[{k}]", reads="a tool result")
                          for k, part in enumerate(content))
    elif content is None:
        content = ""
    elif not isinstance(content, str):
        raise BadRequest(f"'{at}.content' must be a string or a list of text blocks", param=f"{at}.content")
    return {"role": "tool", "tool_call_id": call_id, "content": f"Error: {content}" if is_error else content}


def _block_type(block: Any, at: str, allowed: tuple[str, ...]) -> str:
    """The block's type if it is one of `allowed`, else the 400 that says why not."""
    kind = block.get("type") if isinstance(block, dict) else None
    if kind in allowed:
        return kind
    if not isinstance(block, dict) or not isinstance(kind, str):
        raise BadRequest(f"'{at}' must be a content block: an object with a 'type'", param=at)
    if kind in TEXT_ONLY_BLOCKS:
        reason = "this model reads text only"
    elif kind in THINKING_BLOCKS:
        reason = "this model has no extended thinking"
    elif kind in ("text", "tool_use", "tool_result"):
        reason = "it belongs in a message of the other role"
    else:
        reason = "not a block this server reads"
    raise BadRequest(f"'{at}.type' {kind!r} is not supported here: {reason} (blocks here: "
                     f"{', '.join(allowed)})", param=f"{at}.type")


def _text_block(block: Any, at: str, reads: str = "this field") -> str:
    if not isinstance(block, dict) or block.get("type") != "text":
        kind = block.get("type") if isinstance(block, dict) else None
        raise BadRequest(f"'{at}' must be a text block ({{\"type\": \"text\", \"text\": ...}}); {reads} takes "
                         f"text only, got {kind!r}", param=at)
    fields = FieldReader(block, where=f"{at}.")
    fields.raw("type")
    text = fields.string("text")
    fields.object("cache_control", None, nullable=True)
    if fields.raw("citations", None) not in (None, []):  # what a response's text block echoes back
        raise BadRequest(f"'{at}.citations' is not supported: this server reads no documents to cite",
                         param=f"{at}.citations")
    fields.finish()
    return text


def _chat_tools(value: Any) -> list[dict[str, Any]] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise BadRequest("'tools' must be a list of tools ({\"name\", \"description\", \"input_schema\"})",
                         param="tools")
    out = []
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise BadRequest(f"'{where}' must be an object with 'name' and 'input_schema'", param=where)
        if tool.get("type") not in (None, "custom"):
            raise BadRequest(f"'{where}.type' {tool.get('type')!r} is a server tool, which runs on Anthropic's "
                             "servers; only custom tools (name, description, input_schema) are supported here",
                             param=f"{where}.type")
        fields = FieldReader(tool, where=f"{where}.")
        fields.raw("type")
        function = {"name": fields.raw("name", None), "parameters": fields.object("input_schema")}
        for name in ("description", "strict"):
            if fields.present(name):
                function[name] = fields.raw(name)
        fields.object("cache_control", None, nullable=True)
        fields.finish()
        out.append({"type": "function", "function": function})
    return out


def _chat_tool_choice(value: Any) -> tuple[Any, bool | None]:
    """(chat's tool_choice, parallel_tool_calls), None where the request says nothing."""
    if value is None:
        return None, None
    if not isinstance(value, dict):
        raise BadRequest("'tool_choice' must be an object: {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}",
                         param="tool_choice")
    fields = FieldReader(value, where="tool_choice.")
    kind = fields.string("type", choices=("auto", "any", "tool", "none"))
    name = fields.string("name", non_empty=True) if kind == "tool" else None
    single = fields.boolean("disable_parallel_tool_use", False, nullable=True) if kind != "none" else False
    fields.finish()
    if kind == "tool":
        choice: Any = {"type": "function", "function": {"name": name}}
    else:
        choice = {"auto": "auto", "any": "required", "none": "none"}[kind]
    return choice, (False if single else None)


# The chat parser's field names, and Anthropic's for them (a message quotes the names it cites).
_RENAMES = [
    (re.compile(r"tools\[(\d+)\]\.function\.parameters"), r"tools[\1].input_schema"),
    (re.compile(r"tools\[(\d+)\]\.function\.(name|description|strict)"), r"tools[\1].\2"),
    (re.compile(r"tools\[(\d+)\]\.function\b"), r"tools[\1]"),
    (re.compile(r"'stop(?=[\['])"), "'stop_sequences"),
    (re.compile(r"response_format(\.json_schema)?\.schema"), "output_config.format.schema"),
    (re.compile(r"response_format(\.json_schema)?"), "output_config.format"),
]


def in_anthropic_terms(error: APIError) -> APIError:
    """`error`, raised by the chat route's checks, with Anthropic's field names."""
    return renamed(error, _RENAMES)
