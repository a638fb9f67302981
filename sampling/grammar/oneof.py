"""`oneOf` is compiled as `anyOf`, which is only correct when no document can match two
branches. We accept it when a cheap sufficient check proves the branches disjoint, and
otherwise report it as unsupported (rather than risk emitting a document matching two):

* the branches' possible JSON types are pairwise disjoint, or
* all branches are objects sharing a required property whose `const`/`enum` values are
  pairwise disjoint (a discriminator, e.g. {"kind": {"const": "circle"}}), or
* all branches are `const`/`enum` with pairwise disjoint values,
checked pair by pair, plus: numeric ranges that do not overlap, and object branches where one
requires a property the other forbids.
"""
from __future__ import annotations

import json
import math
from typing import Callable

from .errors import unsupported
from .keywords import JSON_TYPES, TYPE_KEYWORDS, value_key

_ALL = frozenset(JSON_TYPES)


def _values(s: object) -> frozenset[str] | None:
    if not isinstance(s, dict):
        return None
    if "const" in s:
        return frozenset([value_key(s["const"])])
    if "enum" in s and isinstance(s["enum"], list):
        return frozenset(value_key(v) for v in s["enum"])
    return None


def _kinds(s: object, resolve) -> frozenset[str]:
    if not isinstance(s, dict):
        return _ALL
    vals = _values(s)
    if vals is not None:
        out = set()
        for v in vals:
            x = json.loads(v)
            out.add({type(None): "null", bool: "boolean", str: "string", list: "array", dict: "object"}.get(
                type(x), "number"))
        return frozenset(out)
    for comb in ("anyOf", "oneOf"):
        if comb in s:
            return frozenset().union(*(_kinds(resolve(b, ""), resolve) for b in s[comb]))
    t = s.get("type")
    if t is None:
        present = {ty for ty, kws in TYPE_KEYWORDS.items() if set(s) & kws}
        ts = present or set(_ALL)
    else:
        ts = set(t if isinstance(t, list) else [t])
    if s.get("nullable") is True:
        ts.add("null")
    return frozenset("number" if x == "integer" else x for x in ts)


def _discriminated(branches: list) -> bool:
    if not all(isinstance(b, dict) and isinstance(b.get("properties"), dict) for b in branches):
        return False
    common = set.intersection(*(set(b.get("required", [])) & set(b["properties"]) for b in branches))
    for name in common:
        vals = [_values(b["properties"][name]) for b in branches]
        if all(v is not None for v in vals) and _pairwise_disjoint(vals):
            return True
    return False


def _pairwise_disjoint(sets: list) -> bool:
    seen: set = set()
    for s in sets:
        if seen & s:
            return False
        seen |= s
    return True


def _interval(s: object) -> tuple[float, float] | None:
    """[lo, hi] (open ends as +-inf, exclusive bounds nudged) of a numbers-only branch."""
    if not isinstance(s, dict) or _kinds(s, lambda b, w: b) - {"number"}:
        return None
    lo, hi = -math.inf, math.inf
    for key in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
        v = s.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        excl = key.startswith("exclusive") or s.get("exclusive" + key[0].upper() + key[1:]) is True
        if key.endswith("inimum"):
            lo = max(lo, math.nextafter(v, math.inf) if excl else v)
        else:
            hi = min(hi, math.nextafter(v, -math.inf) if excl else v)
    return lo, hi


def _objects_apart(a: object, b: object) -> bool:
    """A property required by one object branch is forbidden by the other."""
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return False
    for x, y in ((a, b), (b, a)):
        if _kinds(x, lambda s, w: s) != {"object"}:
            continue
        props = y.get("properties", {}) if isinstance(y.get("properties"), dict) else {}
        for name in x.get("required", []) if isinstance(x.get("required"), list) else []:
            if props.get(name) is False or (name not in props and y.get("additionalProperties") is False
                                            and not y.get("patternProperties")):
                return True
    return False


def _pair_disjoint(a: object, b: object, resolve) -> bool:
    if not (_kinds(a, resolve) & _kinds(b, resolve)):
        return True
    va, vb = _values(a), _values(b)
    if va is not None and vb is not None and not (va & vb):
        return True
    if _discriminated([a, b]) or _objects_apart(a, b):
        return True
    ia, ib = _interval(a), _interval(b)
    return ia is not None and ib is not None and (ia[1] < ib[0] or ib[1] < ia[0])


def check_disjoint(subs: list, ptr: str, resolve: Callable[[object, str], object]) -> None:
    """Raises unless every pair of branches is proven disjoint (by any of the checks above)."""
    branches = [resolve(s, f"{ptr}/oneOf/{i}") for i, s in enumerate(subs)]
    for i, a in enumerate(branches):
        if a is False:
            continue
        for b in branches[i + 1:]:
            if b is not False and not _pair_disjoint(a, b, resolve):
                raise unsupported("oneOf", ptr, "cannot prove the branches disjoint; use anyOf if overlap is acceptable")
