"""Which JSON Schema keywords are understood, ignored or refused, grouped by what they constrain.

JSON Schema validators ignore keywords they do not know, so the compiler does too: only keywords
in REFUSED (they constrain validity and are not enforced here) stop compilation, by name. The
documentation of each list is in sampling/grammar/README.md.
"""
from __future__ import annotations

import json
import re

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
    "number": frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}),
    "integer": frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}),
}
TYPED = frozenset().union(*TYPE_KEYWORDS.values())

GENERAL = frozenset({"type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "nullable"})

SUPPORTED = TYPED | GENERAL

# Keywords that constrain validity and that this compiler cannot enforce: refused by name.
# (Draft 3's validating keywords are here too, so that an old schema is never half-enforced.)
REFUSED = frozenset({
    "not", "if", "then", "else", "contains", "minContains", "maxContains",
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


_QUICK = frozenset({"type", "enum", "const", "pattern", "minLength", "maxLength"})


def quick_check(value, schema: dict) -> bool | None:
    """Whether `value` is valid against `schema` when only simple keywords constrain it (enum
    values are checked by the ten thousand in large schemas); None when a full validator is needed."""
    if not isinstance(schema, dict) or not constraint_keys(schema) <= _QUICK:
        return None
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        fits = [_has_type(value, t) for t in types]
        if True not in fits:
            return None if None in fits else False
    for key in ("enum", "const"):
        if key in schema:
            options = schema[key] if key == "enum" else [schema[key]]
            if not isinstance(options, list):
                return None
            if value_key(value) not in _option_keys(options):
                return False
    if isinstance(value, str):
        pattern = schema.get("pattern")
        if pattern is not None:
            if not isinstance(pattern, str):
                return None
            try:
                if re.search(pattern, value) is None:
                    return False
            except re.error:
                return None
        for key, ok in (("minLength", lambda n: len(value) >= n), ("maxLength", lambda n: len(value) <= n)):
            n = schema.get(key)
            if n is not None:
                if isinstance(n, bool) or not isinstance(n, int):
                    return None
                if not ok(n):
                    return False
    return True


_OPTION_KEYS: dict[int, tuple[list, frozenset[str]]] = {}


def _option_keys(options: list) -> frozenset[str]:
    """value_key of each option, kept for the list while its values are checked one by one."""
    hit = _OPTION_KEYS.get(id(options))
    if hit is None or hit[0] is not options:
        if len(_OPTION_KEYS) > 64:
            _OPTION_KEYS.clear()
        hit = _OPTION_KEYS[id(options)] = (options, frozenset(value_key(o) for o in options))
    return hit[1]


def _has_type(value, t) -> bool | None:
    """None where drafts differ (1.0 is an integer from draft 6 on) or `t` is not a type name."""
    if t == "integer":
        if isinstance(value, float):
            return False if not value.is_integer() else None
        return isinstance(value, int) and not isinstance(value, bool)
    check = _TYPE_CHECKS.get(t)
    return None if check is None else check(value)


_TYPE_CHECKS = {"string": lambda v: isinstance(v, str), "boolean": lambda v: isinstance(v, bool),
                "null": lambda v: v is None, "array": lambda v: isinstance(v, list),
                "object": lambda v: isinstance(v, dict),
                "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)}
