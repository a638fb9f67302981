"""Tool calling on /v1/chat/completions: the request fields, and the one JSON Schema all calls obey.

Accepted as OpenAI defines them: `tools` (each `{"type": "function", "function": {name,
description, parameters, strict}}`), `tool_choice` ("none" | "auto" | "required" |
`{"type": "function", "function": {"name": ...}}`; "auto" when tools are given, else "none") and
`parallel_tool_calls` (default true). Callable functions become one schema (calls_schema):

    {"tool_calls": [{"name": NAME, "arguments": PARAMETERS}, ...]}

an anyOf over the functions, at least one call, at most one when parallel_tool_calls is false
or a function is named. A model that calls in its own syntax (server/tool_syntax.py) gets the same
calls in that syntax instead (`tool_frame`: the text around each call fixed, the arguments held
to the same schemas). The engine's grammar compiler enforces it ("required" and named), or
enforces it once the output begins with `{` ("auto", sampling/grammar/trigger.py); "none"
generates plain text. The exact text the grammar produces (compact JSON, members in this order)
is also how earlier calls are written back into the prompt (server/tool_prompt.py).
"""
from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from typing import Any

from engine.request import JsonSchema
from sampling.grammar.framed import CallFrame, TextFrame
from server.errors import BadRequest
from server.structured import json_schema_field
from server.tool_syntax import GENERIC, ToolSyntax

NAME_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")
CHOICES = ("none", "auto", "required")
CALLS_KEY = "tool_calls"
OPENING = '{"tool_calls":['  # how every calls document begins (the grammar's forced prefix)


@dataclass(frozen=True)
class Function:
    name: str
    description: str | None
    parameters: dict[str, Any]  # as the client sent it ({} when absent)
    strict: bool | None
    index: int  # its position in `tools`, for error messages

    def declaration(self) -> dict[str, Any]:
        """What the prompt shows of it (deterministic: the client's key order, no extras)."""
        out: dict[str, Any] = {"name": self.name}
        if self.description:
            out["description"] = self.description
        out["parameters"] = self.parameters
        return out


@dataclass(frozen=True)
class ToolSet:
    functions: tuple[Function, ...]
    choice: str  # "none" | "auto" | "required" | "named"
    named: str | None  # the function tool_choice names
    parallel: bool
    syntax: ToolSyntax = GENERIC  # how the served model writes calls

    @property
    def callable(self) -> tuple[Function, ...]:
        """The functions the output may call."""
        if self.choice == "none":
            return ()
        if self.choice == "named":
            return tuple(f for f in self.functions if f.name == self.named)
        return self.functions

    @property
    def max_calls(self) -> int | None:
        return 1 if self.choice == "named" or not self.parallel else None

    @property
    def calls_opening(self) -> str:
        """The text every answer that calls begins with: the generic document's OPENING, or the
        model's own syntax's start (after its opening special token, if it has one)."""
        return OPENING if self.syntax.is_generic else self.syntax.start

    def function(self, name: str) -> Function | None:
        return next((f for f in self.functions if f.name == name), None)

    def calls_schema(self) -> dict[str, Any] | None:
        """The schema every answer that calls functions satisfies (None: no call possible)."""
        functions = self.callable
        if not functions:
            return None
        branches = [_call_schema(f, i) for i, f in enumerate(functions)]
        calls: dict[str, Any] = {"type": "array", "items": {"anyOf": branches}, "minItems": 1}
        if self.max_calls is not None:
            calls["maxItems"] = self.max_calls
        return {"type": "object", "properties": {CALLS_KEY: calls}, "required": [CALLS_KEY],
                "additionalProperties": False}

    def tool_frame(self) -> TextFrame | None:
        """The grammar of calls in the model's own syntax (None: generic syntax, or nothing callable)."""
        functions, s = self.callable, self.syntax
        if not functions or s.is_generic:
            return None
        calls = tuple(CallFrame(s.call_head + f.name + s.name_to_args, s.call_tail, s.id_length, s.id_at)
                      for f in functions)
        arguments = {"anyOf": [_arguments_schema(f, f"#/anyOf/{i}") for i, f in enumerate(functions)]}
        one = self.max_calls == 1 or not s.parallel
        return TextFrame(s.opening, calls, arguments, s.separator, s.closing, 1 if one else None, s.opening_token,
                         after_text=s.calls_after_text, marker=s.marker)

    def calls_json_schema(self) -> JsonSchema | None:
        """calls_schema() as the engine takes it. Not checked again: each function's parameters
        were checked when read, and the frame around them is valid by construction."""
        schema = self.calls_schema()
        return None if schema is None else JsonSchema.assembled(schema)

    def parameters_param(self, pointer: str) -> tuple[str, str] | None:
        """(`tools[i].function.parameters...`, the rest of the pointer) for a JSON pointer into
        calls_schema() that lies inside a function's parameters, else None."""
        m = re.match(rf"/properties/{CALLS_KEY}/items/anyOf/(\d+)/properties/arguments(/.*)?$", pointer) \
            if self.syntax.is_generic else re.match(r"/anyOf/(\d+)(/.*)?$", pointer)
        if m is None or int(m.group(1)) >= len(self.callable):
            return None
        return f"tools[{self.callable[int(m.group(1))].index}].function.parameters", m.group(2) or "/"


def _arguments_schema(function: Function, base: str) -> dict[str, Any]:
    arguments = relocate_refs(copy.deepcopy(function.parameters), base)
    if "type" not in arguments:
        arguments["type"] = "object"  # OpenAI's arguments are always an object
    return arguments


def _call_schema(function: Function, branch: int) -> dict[str, Any]:
    arguments = _arguments_schema(function, f"#/properties/{CALLS_KEY}/items/anyOf/{branch}/properties/arguments")
    return {"type": "object", "properties": {"name": {"const": function.name}, "arguments": arguments},
            "required": ["name", "arguments"], "additionalProperties": False}


# Keywords whose values are data, not schemas: a "$ref" inside them is not a reference.
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples", "example"})


def relocate_refs(schema: Any, base: str) -> Any:
    """Rewrite local `$ref`s ("#", "#/...") of a schema that is moved from the document root to
    `base` (a "#/..." pointer), so they still point into it. In place; returns it."""
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key == "$ref" and isinstance(value, str) and (value == "#" or value.startswith("#/")):
                schema[key] = base + value[1:]
            elif key not in _DATA_KEYWORDS:  # a dict under "$ref" is a property named "$ref"
                relocate_refs(value, base)
    elif isinstance(schema, list):
        for item in schema:
            relocate_refs(item, base)
    return schema


def parse_tools(tools: Any, tool_choice: Any, parallel: Any, syntax: ToolSyntax = GENERIC) -> ToolSet | None:
    """The three request fields, checked; None when the request involves no tools at all.
    `syntax`: how the served model writes calls (its ChatFormatter's tool_syntax)."""
    if tools is None or tools == []:
        if tool_choice not in (None, "none"):
            raise BadRequest("'tool_choice' needs 'tools': no function is declared", param="tool_choice")
        return None
    if not isinstance(tools, list):
        raise BadRequest("'tools' must be a list of {\"type\": \"function\", \"function\": {...}}", param="tools")
    functions: list[Function] = []
    for i, tool in enumerate(tools):
        function = _function(tool, i)
        if any(f.name == function.name for f in functions):
            raise BadRequest(f"'tools[{i}].function.name' {function.name!r} is declared twice; names must be "
                             "unique", param=f"tools[{i}].function.name")
        functions.append(function)
    choice, named = _tool_choice(tool_choice, functions)
    if parallel is not None and not isinstance(parallel, bool):
        raise BadRequest("'parallel_tool_calls' must be true or false", param="parallel_tool_calls")
    return ToolSet(tuple(functions), choice, named, True if parallel is None else parallel, syntax)


def _function(tool: Any, i: int) -> Function:
    where = f"tools[{i}]"
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
        raise BadRequest(f"'{where}' must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}",
                         param=where)
    extra = set(tool) - {"type", "function"}
    if extra:
        raise BadRequest(f"unknown field(s) in '{where}': {', '.join(sorted(extra))}", param=where)
    spec = tool["function"]
    extra = set(spec) - {"name", "description", "parameters", "strict"}
    if extra:
        raise BadRequest(f"unknown field(s) in '{where}.function': {', '.join(sorted(extra))}",
                         param=f"{where}.function")
    name = spec.get("name")
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise BadRequest(f"'{where}.function.name' must be 1 to 64 letters, digits, '_' or '-', got {name!r}",
                         param=f"{where}.function.name")
    description = spec.get("description")
    if description is not None and not isinstance(description, str):
        raise BadRequest(f"'{where}.function.description' must be a string", param=f"{where}.function.description")
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise BadRequest(f"'{where}.function.strict' must be true or false", param=f"{where}.function.strict")
    param = f"{where}.function.parameters"
    parameters = spec.get("parameters")
    if parameters is None:
        parameters = {}
    json_schema_field(parameters, param)
    if parameters.get("type", "object") != "object":
        raise BadRequest(f"'{param}' must describe an object (\"type\": \"object\"): arguments are a JSON object",
                         param=param)
    return Function(name, description, parameters, strict, i)


def _tool_choice(value: Any, functions: list[Function]) -> tuple[str, str | None]:
    if value is None:
        return "auto", None
    if isinstance(value, str):
        if value not in CHOICES:
            raise BadRequest(f"'tool_choice' must be one of {', '.join(map(repr, CHOICES))} or "
                             f"{{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, got {value!r}",
                             param="tool_choice")
        return value, None
    if (not isinstance(value, dict) or value.get("type") != "function" or set(value) != {"type", "function"}
            or not isinstance(value["function"], dict) or set(value["function"]) != {"name"}):
        raise BadRequest("'tool_choice' must be a string or {\"type\": \"function\", \"function\": {\"name\": ...}}",
                         param="tool_choice")
    name = value["function"]["name"]
    if not any(f.name == name for f in functions):
        declared = ", ".join(repr(f.name) for f in functions)
        raise BadRequest(f"'tool_choice' names the function {name!r}, which 'tools' does not declare "
                         f"(declared: {declared})", param="tool_choice")
    return "named", name


def call_text(name: str, arguments: str) -> str:
    """One call exactly as the grammar writes it (arguments: the JSON text, verbatim)."""
    return '{"name":' + json.dumps(name) + ',"arguments":' + arguments + "}"


def calls_text(calls: list[tuple[str, str]]) -> str:
    """A whole calls document as the grammar writes it."""
    return OPENING + ",".join(call_text(n, a) for n, a in calls) + "]}"
