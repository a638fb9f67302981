"""`oneOf` is compiled as `anyOf`, which is only correct when no generated document can match
two branches. A pair of branches is proven apart when no type one generates is admitted by the
other, or by disjoint const / enum values, a discriminator (a required property with disjoint
values), a required property the other forbids, string patterns whose automata share no string,
or numeric ranges that do not meet.

Object branches left unproven are narrowed (which only loses documents): a property they all
declare with disjoint values becomes required, or else each must have one of its members that
its closed partners forbid. Anything else is reported as unsupported rather than risk a
document matching two branches.
"""
from __future__ import annotations

import json
import math
import re
from typing import Callable

from .errors import SchemaError, unsupported
from .nfa import intersection
from .regex import search_ir
from .keywords import JSON_TYPES, TYPE_KEYWORDS, quick_check, value_key

_ALL = frozenset(JSON_TYPES)


def _values(s: object) -> frozenset[str] | None:
    """The values a const / enum schema (or an allOf with one) allows, less those its other
    keywords rule out when they are simple. A superset is sound here: it only proves fewer
    branches apart."""
    if not isinstance(s, dict):
        return None
    parts = [s] + [p for p in s.get("allOf", []) if isinstance(p, dict)] if isinstance(s.get("allOf"), list) else [s]
    for part in parts:
        if "const" in part:
            values = [part["const"]]
        elif "enum" in part and isinstance(part["enum"], list):
            values = part["enum"]
        else:
            continue
        return frozenset(value_key(v) for v in values if all(quick_check(v, p) is not False for p in parts))
    return None


def _kinds(s: object, resolve, inferred: bool, depth: int = 0) -> frozenset[str]:
    """JSON types `s` admits. `inferred`: an absent `type` admits only the types its keywords
    name, as the compiler generates by default; otherwise (validation, open_objects) all."""
    if not isinstance(s, dict) or depth > 16:   # (recursive refs may lead back here)
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
            return frozenset().union(*(_kinds(resolve(b, ""), resolve, inferred, depth + 1) for b in s[comb]))
    t = s.get("type")
    if t is None:
        present = {ty for ty, kws in TYPE_KEYWORDS.items() if set(s) & kws} if inferred else None
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
    if not isinstance(s, dict):
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
    """A property required by one object branch is forbidden by the other (both generate
    objects only)."""
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return False
    for x, y in ((a, b), (b, a)):
        props = y.get("properties", {}) if isinstance(y.get("properties"), dict) else {}
        for name in x.get("required", []) if isinstance(x.get("required"), list) else []:
            if props.get(name) is False or (name not in props and y.get("additionalProperties") is False
                                            and not y.get("patternProperties")):
                return True
    return False


# Classes whose automata approximate Python's Unicode-aware meaning, and inline flags: an
# empty intersection of the automata proves nothing then.
_APPROXIMATE = re.compile(r"\\[dDwWsSbB]|\(\?[a-zA-Z]")


def _patterns_apart(a: dict, b: dict) -> bool:
    """Two string branches whose patterns no string matches both (their automata's product
    reaches no accepting state)."""
    pa, pb = a.get("pattern"), b.get("pattern")
    if not (isinstance(pa, str) and isinstance(pb, str)) or _APPROXIMATE.search(pa + pb):
        return False
    try:
        both = intersection(search_ir(pa, ""), search_ir(pb, ""))
    except SchemaError:
        return False
    return both is not None and not any(both.accept)


def _pair_disjoint(a: object, b: object, resolve, open_types: bool) -> bool:
    """No document generated from one branch is valid against the other."""
    made_a, made_b = _kinds(a, resolve, not open_types), _kinds(b, resolve, not open_types)
    if not (made_a & _kinds(b, resolve, False)) and not (made_b & _kinds(a, resolve, False)):
        return True
    va, vb = _values(a), _values(b)
    if va is not None and vb is not None and not (va & vb):
        return True
    if made_a == made_b == {"object"}:
        return _discriminated([a, b]) or _objects_apart(a, b)
    if made_a == made_b == {"string"}:
        return _patterns_apart(a, b)
    if made_a | made_b <= {"number"}:
        ia, ib = _interval(a), _interval(b)
        return ia[1] < ib[0] or ib[1] < ia[0]
    return False


def disjoint_branches(subs: list, ptr: str, resolve: Callable[[object, str], object], open_types: bool) -> list:
    """The branches to generate from: `subs` when every pair is proven disjoint; else the
    branches of the unproven pairs narrowed until they are (a narrowed branch only loses
    documents, and each stays apart from the others as written); raises when neither works."""
    branches = [resolve(s, f"{ptr}/oneOf/{i}") for i, s in enumerate(subs)]
    partners: dict[int, list[int]] = {}
    for i, a in enumerate(branches):
        for j in range(i + 1, len(branches)):
            b = branches[j]
            if a is not False and b is not False and not _pair_disjoint(a, b, resolve, open_types):
                partners.setdefault(i, []).append(j)
                partners.setdefault(j, []).append(i)
    if not partners:
        return subs
    involved = sorted(partners)
    # Only object branches are narrowed (to objects first: other values would match any of
    # them, and an untyped branch admits them under JSON Schema's reading).
    objects = all(_kinds(branches[i], resolve, True) == {"object"}
                  and isinstance(branches[i].get("properties"), dict) for i in involved)
    if not objects:
        raise unsupported("oneOf", ptr, "cannot prove the branches disjoint; use anyOf if overlap is acceptable")
    out = list(subs)
    name = _optional_discriminator([branches[i] for i in involved])
    if name is not None:
        # Present, the property's values tell the branches apart: make it required.
        for i in involved:
            out[i] = {"allOf": [subs[i], {"type": "object", "required": [name]}]}
        return out
    for i in involved:
        # A member the branch allows and its (closed) partners do not: require one of them.
        own = _own_members(branches[i], [branches[j] for j in partners[i]])
        if not own:
            raise unsupported("oneOf", ptr, "cannot prove the branches disjoint; use anyOf if overlap is acceptable")
        out[i] = {"anyOf": [{"allOf": [subs[i], {"type": "object", "required": [n]}]} for n in own[:_MAX_OWN]]}
    return out


_MAX_OWN = 3


def _optional_discriminator(branches: list[dict]) -> str | None:
    """A property every branch declares with pairwise disjoint const / enum values."""
    names = set.intersection(*(set(b["properties"]) for b in branches))
    for name in sorted(names):
        vals = [_values(b["properties"][name]) for b in branches]
        if all(v is not None for v in vals) and _pairwise_disjoint(vals):
            return name
    return None


def _own_members(x: dict, others: list[dict]) -> list[str]:
    """Properties of `x` that every one of `others` forbids (they allow no other members)."""
    if not all(y.get("additionalProperties") is False and not y.get("patternProperties")
               and isinstance(y.get("properties"), dict) for y in others):
        return []
    return [n for n, v in x["properties"].items() if v is not False and all(n not in y["properties"] for y in others)]
