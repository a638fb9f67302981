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
_encode_string = json.encoder.encode_basestring      # what _COMPACT does with a str

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


_CONSTRAINING = SUPPORTED | REFUSED


def constraint_keys(schema: dict) -> frozenset[str]:
    """Keys that constrain the instance: the supported and refused ones (others are ignored)."""
    return _CONSTRAINING.intersection(schema)


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
    if type(v) is str:      # keys, mostly: straight to the C encoder
        return _encode_string(v).encode("utf-8", "surrogatepass")
    return _COMPACT.encode(v).encode("utf-8", "surrogatepass")


def count_keyword(schema: dict, key: str, ptr: str) -> int | None:
    v = schema.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or v != int(v):
        raise SchemaError(f"{key!r} at {ptr or '/'} must be a non-negative integer")
    return int(v)


_QUICK = frozenset({"type", "enum", "const", "pattern", "minLength", "maxLength"})

# Values -> a verdict per value: True, False, or None where a full validator is needed.
BatchCheck = Callable[[list], list]


def quick_checker(schema: dict) -> BatchCheck | None:
    """A check of many values at once against `schema` when only simple keywords constrain it,
    the schema's keywords read once: callers checking many values against one schema keep it
    (reading a long enum again per value is quadratic), and one call checks them all, with no
    Python call per value (see README.md, "Frame stack"). None when `schema` needs a validator."""
    return _checker(schema) if isinstance(schema, dict) else None


def _checker(schema: dict) -> BatchCheck | None:
    if not constraint_keys(schema) <= _QUICK:
        return None
    checks: list[BatchCheck] = []
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]

        def of_type(values: list) -> list:
            per_type = [_type_verdicts(values, t) for t in types] or [[False] * len(values)]
            return [True if True in fits else None if None in fits else False for fits in zip(*per_type)]
        checks.append(of_type)
    for key in ("enum", "const"):
        if key in schema:
            options = schema[key] if key == "enum" else [schema[key]]
            if not isinstance(options, list):
                return None
            keys = frozenset(value_key(o) for o in options)
            checks.append(lambda values, keys=keys: [value_key(v) in keys for v in values])
    string_checks = _string_checks(schema)
    if string_checks is None:
        return None
    checks += string_checks
    if not checks:
        return lambda values: [True] * len(values)
    if len(checks) == 1:
        return checks[0]

    def check(values: list) -> list:
        out = checks[0](values)
        for c in checks[1:]:        # the first verdict that is not True stands
            out = [a if a is not True else b for a, b in zip(out, c(values))]
        return out
    return check


def _string_checks(schema: dict) -> list[BatchCheck] | None:
    """Checks of the string keywords (true for any other value), or None if one is malformed."""
    checks: list[BatchCheck] = []
    pattern = schema.get("pattern")
    if pattern is not None:
        if not isinstance(pattern, str):
            return None
        try:
            search = re.compile(pattern).search
        except re.error:
            return None
        checks.append(lambda values: [not isinstance(v, str) or search(v) is not None for v in values])
    n = schema.get("minLength")
    if n is not None:
        if isinstance(n, bool) or not isinstance(n, int):
            return None
        checks.append(lambda values, n=n: [not isinstance(v, str) or len(v) >= n for v in values])
    n = schema.get("maxLength")
    if n is not None:
        if isinstance(n, bool) or not isinstance(n, int):
            return None
        checks.append(lambda values, n=n: [not isinstance(v, str) or len(v) <= n for v in values])
    return checks


def _type_verdicts(values: list, t: object) -> list:
    """Whether each value has JSON type `t`; None where drafts differ (1.0 is an integer from
    draft 6 on) or `t` is not a type name."""
    if t == "integer":
        return [(None if v.is_integer() else False) if isinstance(v, float)
                else isinstance(v, int) and not isinstance(v, bool) for v in values]
    if t == "number":
        return [isinstance(v, (int, float)) and not isinstance(v, bool) for v in values]
    kind = _PYTHON_TYPES.get(t) if isinstance(t, str) else None
    if kind is None:
        return [None] * len(values)
    return [isinstance(v, kind) for v in values]


_PYTHON_TYPES = {"string": str, "boolean": bool, "null": type(None), "array": list, "object": dict}
