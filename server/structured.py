"""Structured output (JSON, optionally matching a JSON Schema): request parsing.

A schema is checked once, by the engine's own check (engine.request.JsonSchema), when its field
is read: a schema that is not valid JSON Schema is a 400 naming the field, with the message the
Python API gives. It is then sent as a Request with `format="json"` and `json_schema` (that
JsonSchema, or None for any object), which the engine enforces with a grammar compiled from it
and does not check again. Schemas the grammar compiler cannot express (an unsupported keyword,
say) are refused by the engine at submit with an InvalidParameterError starting "json_schema:",
also a 400. The response's `structured_data` is `GenerationResult.structured_data` (the engine's
parse of the finished document), else the result text parsed as JSON.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from engine.request import JsonSchema
from sampling.errors import InvalidParameterError
from server.errors import BadRequest, InternalError

# What /generate's "format": "json" and OpenAI's json_object mean: any JSON object. It is
# validated like a user schema but sent to the engine as "no schema" (its default is an object).
ANY_JSON_OBJECT: dict[str, Any] = {"type": "object"}


@dataclass(frozen=True)
class StructuredOutput:
    schema: JsonSchema | None  # None: any JSON object
    source: str  # which request field asked for it, for error messages


def json_schema_field(value: Any, param: str) -> JsonSchema:
    """The field `param` as a checked JsonSchema, or the engine's refusal as a 400 naming it."""
    try:
        return JsonSchema(value, name=param)
    except InvalidParameterError as exc:
        raise BadRequest(str(exc), param=param) from None


def from_generate_fields(output_format: str | None, json_schema: Any) -> StructuredOutput | None:
    """/generate's `format` ('raw' | 'json'; None when not given) and `json_schema`. A schema
    alone implies "json"; "raw" beside a schema contradicts it."""
    if json_schema is not None:
        if output_format == "raw":
            raise BadRequest("'json_schema' constrains the output to JSON: drop \"format\": \"raw\" "
                             "(or send \"format\": \"json\")", param="format")
        return StructuredOutput(json_schema_field(json_schema, "json_schema"), source="json_schema")
    if output_format == "json":
        return StructuredOutput(None, source="format")
    return None


def from_response_format(value: Any) -> StructuredOutput | None:
    """OpenAI's `response_format`: {"type": "text" | "json_object" | "json_schema", ...}."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise BadRequest("'response_format' must be an object", param="response_format")
    kind = value.get("type")
    extra = set(value) - {"type", "json_schema"}
    if extra:
        raise BadRequest(f"unknown field(s) in 'response_format': {', '.join(sorted(extra))}", param="response_format")
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutput(None, source="response_format")
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict):
            raise BadRequest(
                "'response_format.json_schema' must be an object with 'name' and 'schema'",
                param="response_format",
            )
        unknown = set(spec) - {"name", "schema", "strict", "description"}
        if unknown:
            raise BadRequest(
                f"unknown field(s) in 'response_format.json_schema': {', '.join(sorted(unknown))}",
                param="response_format",
            )
        if not isinstance(spec.get("name"), str) or not spec["name"]:
            raise BadRequest("'response_format.json_schema.name' must be a non-empty string", param="response_format")
        if spec.get("strict") is not None and not isinstance(spec["strict"], bool):
            raise BadRequest("'response_format.json_schema.strict' must be true or false", param="response_format")
        schema = json_schema_field(spec.get("schema", ANY_JSON_OBJECT), "response_format.json_schema.schema")
        return StructuredOutput(schema, source="response_format")
    raise BadRequest(
        f"'response_format.type' must be 'text', 'json_object' or 'json_schema', got {kind!r}",
        param="response_format",
    )


def structured_data(result: Any) -> Any:
    """The JSON value a constrained generation produced: the engine's own parse when it gives
    one, else the text parsed here. Only a generation that ended by itself is complete; one cut
    off (max_tokens, context) has no value. Invalid JSON from a finished constrained generation
    would be an engine bug, so it is reported, not hidden."""
    if result.finish_reason.value != "stop":
        return None
    parsed = getattr(result, "structured_data", None)
    if parsed is not None:
        return parsed
    try:
        return json.loads(result.text)
    except json.JSONDecodeError as exc:
        raise InternalError(f"structured generation did not produce valid JSON: {exc}") from None
