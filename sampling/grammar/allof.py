"""`allOf` by merging: the sub-schemas are folded into one schema with the same instances.

Handled exactly: type intersection, tighter numeric / length / count bounds, required union,
enum intersection, per-property allOf, and additionalProperties with the JSON Schema meaning
(a branch with `additionalProperties: false` forbids the other branches' extra properties;
a schema-valued one constrains them). Anything else must be equal in all branches or is
reported as unsupported.
"""
from __future__ import annotations

from typing import Callable

from .errors import SchemaError, unsupported
from .keywords import constraint_keys, value_key

_MAX_KEYS = ("minLength", "minItems", "minimum", "exclusiveMinimum", "minProperties")
_MIN_KEYS = ("maxLength", "maxItems", "maximum", "exclusiveMaximum", "maxProperties")


def merge_all_of(schema: dict, ptr: str, resolve: Callable[[object, str], dict]) -> dict:
    """Fold `schema["allOf"]` (and the schema's own other keywords) into a single schema.

    `resolve(sub, where)` returns the dict a sub-schema stands for (following $ref); it raises
    for what cannot be inlined (recursive references).
    """
    constraining = constraint_keys(schema)
    own = {k: v for k, v in schema.items() if k != "allOf" and k in constraining}
    subs = schema["allOf"]
    if not isinstance(subs, list) or not subs:
        raise SchemaError(f"'allOf' at {ptr or '/'} must be a non-empty array")
    branches = []
    for i, sub in enumerate(subs):
        where = f"{ptr}/allOf/{i}"
        sub = resolve(sub, where)
        if sub is False:
            raise SchemaError(f"no JSON document satisfies this schema (false in allOf at {where})")
        if sub is True:
            continue
        if "allOf" in sub:
            sub = merge_all_of(sub, where, resolve)
        constraining = constraint_keys(sub)
        branches.append({k: v for k, v in sub.items() if k in constraining})
    # Merged members keep the order the schema is written in (llguidance does the same): the
    # schema's own `properties` go after the allOf's when written after it.
    keys = list(schema)
    own_last = "properties" in own and keys.index("properties") > keys.index("allOf")
    return _merge(branches + [own] if own_last else [own] + branches, ptr)


def with_all_of(schema: dict, key: str, subs: list, ptr: str) -> dict:
    """`schema` with `key` replaced, where it stands, by an `allOf` of `subs` (joined, in key
    order, with an `allOf` already there): the position decides the order of merged members."""
    out: dict = {}
    for k, v in schema.items():
        if k == key or k == "allOf":
            if not isinstance(v, list) and k == "allOf":
                raise SchemaError(f"'allOf' at {ptr or '/'} must be a non-empty array")
            out["allOf"] = out.get("allOf", []) + (subs if k == key else v)
        else:
            out[k] = v
    return out


def _types(b: dict) -> set[str] | None:
    t = b.get("type")
    if t is None:
        return None
    ts = set(t if isinstance(t, list) else [t])
    if b.get("nullable") is True:
        ts.add("null")
    return ts


def _merge(branches: list[dict], ptr: str) -> dict:
    out: dict = {}
    # type (nullable folded in so that it intersects too)
    typesets = [ts for ts in (_types(b) for b in branches) if ts is not None]
    if typesets:
        common = set(typesets[0])
        for ts in typesets[1:]:
            keep = common & ts
            if "integer" in ts and "number" in common or "number" in ts and "integer" in common:
                keep.add("integer")
            common = keep
        if not common:
            raise SchemaError(f"no JSON document satisfies this schema (allOf types conflict at {ptr or '/'})")
        out["type"] = sorted(common)
    elif all(b.get("nullable") is True for b in branches if "nullable" in b) and any("nullable" in b for b in branches):
        out["nullable"] = True
    keys = set().union(*branches) - {"type", "nullable"}
    for key in sorted(keys):
        vals = [b[key] for b in branches if key in b]
        if key in _MAX_KEYS or key in _MIN_KEYS:
            if any(isinstance(v, bool) for v in vals):
                raise unsupported(key, ptr, "boolean exclusive bounds inside allOf")
            out[key] = max(vals) if key in _MAX_KEYS else min(vals)
        elif key == "required":
            out[key] = list(dict.fromkeys(name for v in vals for name in v))
        elif key == "enum":
            allowed = {value_key(x) for x in vals[0]}
            for v in vals[1:]:
                allowed &= {value_key(x) for x in v}
            out[key] = [x for x in vals[0] if value_key(x) in allowed]
        elif key in ("properties", "additionalProperties"):
            continue
        elif key == "uniqueItems":
            out[key] = any(v is True for v in vals)
        elif len(_distinct(vals)) == 1:
            out[key] = vals[0]
        else:
            raise unsupported("allOf", ptr, f"branches disagree on {key!r}")
    if any("properties" in b or "additionalProperties" in b for b in branches):
        _merge_objects(branches, out, ptr)
    # Keys in the order of the first branch holding them: an `anyOf` carried over from an
    # earlier branch stays ahead of a later branch's `properties` (see with_all_of).
    first: dict[str, int] = {}
    for i, b in enumerate(branches):
        for k in b:
            first.setdefault(k, i)
    return dict(sorted(out.items(), key=lambda item: first.get(item[0], 0)))


def _merge_objects(branches: list[dict], out: dict, ptr: str) -> None:
    if "patternProperties" in out and any(
            "patternProperties" not in b and b.get("additionalProperties", True) is not True for b in branches):
        # Another branch's additionalProperties would also constrain the pattern-named members.
        raise unsupported("allOf", ptr, "patternProperties merged with another branch's additionalProperties")
    names = list(dict.fromkeys(n for b in branches for n in b.get("properties", {})))
    props: dict = {}
    for name in names:
        parts = []
        for b in branches:
            declared = b.get("properties", {})
            extra = b.get("additionalProperties", True)
            if name in declared:
                parts.append(declared[name])
            elif extra is False:
                parts = None        # this branch forbids the property altogether
                break
            elif extra is not True:
                parts.append(extra)
        if parts is None:
            if name in out.get("required", []):
                raise SchemaError(f"no JSON document satisfies this schema (property {name!r} "
                                  f"required but forbidden by allOf at {ptr or '/'})")
            continue
        uniq = _distinct(parts) if len(parts) > 1 else parts
        props[name] = uniq[0] if len(uniq) == 1 else {"allOf": uniq}
    out["properties"] = props
    extras = [b["additionalProperties"] for b in branches if "additionalProperties" in b]
    if any(e is False for e in extras):
        out["additionalProperties"] = False
    else:
        schemas = _distinct([e for e in extras if e is not True])
        if len(schemas) == 1:
            out["additionalProperties"] = schemas[0]
        elif schemas:
            out["additionalProperties"] = {"allOf": schemas}


def _distinct(schemas: list) -> list:
    """`schemas` without repeats (equal as JSON Schema values). Python's == goes first: it is
    quick on different or shared sub-schemas, while value_key serialises the whole value (large
    sub-schemas are merged hundreds of times); but True == 1 in Python, so value_key decides."""
    out: list = []
    for s in schemas:
        if not any(s is t or (s == t and value_key(s) == value_key(t)) for t in out):
            out.append(s)
    return out
