"""Which JSON Schema keywords are understood, ignored or refused, grouped by what they constrain.

JSON Schema validators ignore keywords they do not know, so the compiler does too: only keywords
in REFUSED (they constrain validity and are not enforced here) stop compilation, by name. The
documentation of each list is in sampling/grammar/README.md.
"""
from __future__ import annotations

import json

from .errors import SchemaError

_COMPACT = {"separators": (",", ":"), "ensure_ascii": False, "allow_nan": False}

ANNOTATIONS = frozenset({
    "title", "description", "$schema", "$id", "id", "examples", "default", "$comment",
    "deprecated", "readOnly", "writeOnly", "$defs", "definitions", "$anchor", "$dynamicAnchor",
    "$recursiveAnchor", "$vocabulary", "contentEncoding", "contentMediaType", "contentSchema",
})

TYPE_KEYWORDS: dict[str, frozenset[str]] = {
    "object": frozenset({"properties", "required", "additionalProperties", "patternProperties",
                         "dependentRequired", "dependencies", "minProperties", "maxProperties"}),
    "array": frozenset({"items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems"}),
    "string": frozenset({"minLength", "maxLength", "pattern", "format"}),
    "number": frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}),
    "integer": frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}),
}
TYPED = frozenset().union(*TYPE_KEYWORDS.values())

GENERAL = frozenset({"type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "nullable"})

SUPPORTED = TYPED | GENERAL

# Keywords that constrain validity and that this compiler cannot enforce: refused by name.
# (Draft 3's validating keywords are here too, so that an old schema is never half-enforced.)
REFUSED = frozenset({
    "not", "if", "then", "else", "multipleOf", "contains", "minContains", "maxContains",
    "propertyNames", "unevaluatedProperties", "unevaluatedItems", "dependentSchemas",
    "$dynamicRef", "$recursiveRef", "divisibleBy", "disallow", "extends",
})

JSON_TYPES = ("object", "array", "string", "integer", "number", "boolean", "null")


def constraint_keys(schema: dict) -> set[str]:
    """Keys that constrain the instance: the supported and refused ones (others are ignored)."""
    return {k for k in schema if k in SUPPORTED or k in REFUSED}


def escape_pointer(token: str) -> str:
    return str(token).replace("~", "~0").replace("/", "~1")


def value_key(v) -> str:
    """JSON text equal for values JSON Schema calls equal (1 == 1.0, key order aside)."""
    return json.dumps(_normal_value(v), sort_keys=True, separators=(",", ":"))


def _normal_value(v):
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, list):
        return [_normal_value(x) for x in v]
    if isinstance(v, dict):
        return {k: _normal_value(x) for k, x in v.items()}
    return v


def dump_json(v) -> bytes:
    return json.dumps(v, **_COMPACT).encode("utf-8", "surrogatepass")


def count_keyword(schema: dict, key: str, ptr: str) -> int | None:
    v = schema.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or v != int(v):
        raise SchemaError(f"{key!r} at {ptr or '/'} must be a non-negative integer")
    return int(v)
