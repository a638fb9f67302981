"""Which JSON Schema keywords are understood, grouped by the instance type they constrain."""
from __future__ import annotations

ANNOTATIONS = frozenset({
    "title", "description", "$schema", "$id", "examples", "default", "$comment",
    "deprecated", "readOnly", "writeOnly", "$defs", "definitions",
})

TYPE_KEYWORDS: dict[str, frozenset[str]] = {
    "object": frozenset({"properties", "required", "additionalProperties"}),
    "array": frozenset({"items", "prefixItems", "additionalItems", "minItems", "maxItems"}),
    "string": frozenset({"minLength", "maxLength", "pattern", "format"}),
    "number": frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}),
    "integer": frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}),
}
TYPED = frozenset().union(*TYPE_KEYWORDS.values())

GENERAL = frozenset({"type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "nullable"})

SUPPORTED = ANNOTATIONS | TYPED | GENERAL

JSON_TYPES = ("object", "array", "string", "integer", "number", "boolean", "null")


def constraint_keys(schema: dict) -> set[str]:
    """Keys that constrain the instance (everything but annotations)."""
    return {k for k in schema if k not in ANNOTATIONS}


def escape_pointer(token: str) -> str:
    return str(token).replace("~", "~0").replace("/", "~1")
