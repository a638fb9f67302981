"""`oneOf` is compiled as `anyOf`, which is only correct when no document can match two
branches. We accept it when a cheap sufficient check proves the branches disjoint, and
otherwise report it as unsupported (rather than risk emitting a document matching two):

* the branches' possible JSON types are pairwise disjoint, or
* all branches are objects sharing a required property whose `const`/`enum` values are
  pairwise disjoint (a discriminator, e.g. {"kind": {"const": "circle"}}), or
* all branches are `const`/`enum` with pairwise disjoint values.
"""
from __future__ import annotations

import json
from typing import Callable

from .errors import unsupported
from .keywords import JSON_TYPES, TYPE_KEYWORDS

_ALL = frozenset(JSON_TYPES)


def _values(s: object) -> frozenset[str] | None:
    if not isinstance(s, dict):
        return None
    if "const" in s:
        return frozenset([json.dumps(s["const"], sort_keys=True)])
    if "enum" in s and isinstance(s["enum"], list):
        return frozenset(json.dumps(v, sort_keys=True) for v in s["enum"])
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


def check_disjoint(subs: list, ptr: str, resolve: Callable[[object, str], object]) -> None:
    branches = [resolve(s, f"{ptr}/oneOf/{i}") for i, s in enumerate(subs)]
    if _pairwise_disjoint([_kinds(b, resolve) for b in branches]):
        return
    vals = [_values(b) for b in branches]
    if all(v is not None for v in vals) and _pairwise_disjoint(vals):
        return
    if _discriminated(branches):
        return
    raise unsupported("oneOf", ptr, "cannot prove the branches disjoint; use anyOf if overlap is acceptable")
