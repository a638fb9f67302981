"""Which JSON Schema keywords are understood, ignored or refused, grouped by what they constrain.

JSON Schema validators ignore keywords they do not know, so the compiler does too: only keywords
in REFUSED (they constrain validity and are not enforced here) stop compilation, by name. The
documentation of each list is in sampling/grammar/README.md.
"""
from __future__ import annotations

import json
import re
from typing import Callable

from .errors import SchemaError

_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)   # one, not one per call

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
    return _COMPACT.encode(v).encode("utf-8", "surrogatepass")


def count_keyword(schema: dict, key: str, ptr: str) -> int | None:
    v = schema.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or v != int(v):
        raise SchemaError(f"{key!r} at {ptr or '/'} must be a non-negative integer")
    return int(v)


_QUICK = frozenset({"type", "enum", "const", "pattern", "minLength", "maxLength"})


def quick_checker(schema: dict) -> Callable[[object], bool | None] | None:
    """A check of whether a value is valid against `schema` when only simple keywords constrain
    it (the check answers None where a full validator is needed), the schema's keywords read
    once: callers checking many values against one schema keep it (reading a long enum again
    per value is quadratic). None when `schema` needs a validator."""
    return _checker(schema) if isinstance(schema, dict) else None


def _checker(schema: dict) -> Callable[[object], bool | None] | None:
    if not constraint_keys(schema) <= _QUICK:
        return None
    checks: list[Callable[[object], bool | None]] = []
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]

        def of_type(value) -> bool | None:
            fits = [_has_type(value, t) for t in types]
            return True if True in fits else None if None in fits else False
        checks.append(of_type)
    for key in ("enum", "const"):
        if key in schema:
            options = schema[key] if key == "enum" else [schema[key]]
            if not isinstance(options, list):
                return None
            keys = frozenset(value_key(o) for o in options)
            checks.append(lambda value, keys=keys: value_key(value) in keys)
    string_checks = _string_checks(schema)
    if string_checks is None:
        return None
    checks += string_checks
    if len(checks) == 1:
        return checks[0]

    def check(value) -> bool | None:
        for c in checks:
            verdict = c(value)
            if verdict is not True:
                return verdict
        return True
    return check


def _string_checks(schema: dict) -> list[Callable[[object], bool]] | None:
    """Checks of the string keywords (true for any other value), or None if one is malformed."""
    checks: list[Callable[[object], bool]] = []
    pattern = schema.get("pattern")
    if pattern is not None:
        if not isinstance(pattern, str):
            return None
        try:
            search = re.compile(pattern).search
        except re.error:
            return None
        checks.append(lambda v: not isinstance(v, str) or search(v) is not None)
    n = schema.get("minLength")
    if n is not None:
        if isinstance(n, bool) or not isinstance(n, int):
            return None
        checks.append(lambda v, n=n: not isinstance(v, str) or len(v) >= n)
    n = schema.get("maxLength")
    if n is not None:
        if isinstance(n, bool) or not isinstance(n, int):
            return None
        checks.append(lambda v, n=n: not isinstance(v, str) or len(v) <= n)
    return checks


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
