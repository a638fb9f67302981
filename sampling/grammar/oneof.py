"""`oneOf` is compiled as `anyOf`, which is only correct when no generated document matches
two branches. For each ordered pair of branches we look for a proof that nothing generated from
the first is valid against the second as written: no type in common (an untyped branch admits
every type when validated), const / enum values the other refuses, a required property the
other forbids or gives other values, string patterns whose automata share no string, numeric
ranges that do not meet.

A branch left without a proof against some other is dropped when that other admits everything
it generates (an untyped object schema admits every string: strings can never match just one),
else narrowed, which only loses documents: an object branch to the objects holding one of its
members that separates it from those others (forbidden there, or with values they refuse).
Anything else is reported as unsupported.
"""
from __future__ import annotations

import json
import math
import re
from typing import Callable

from .errors import SchemaError, unsupported
from .keywords import JSON_TYPES, TYPE_KEYWORDS, quick_checker, value_key
from .products import intersection
from .regex import search_ir

_ALL = frozenset(JSON_TYPES)
_MAX_SEPARATORS = 3     # members a narrowed branch may choose between (automaton size)
# Keywords that constrain a value whatever its type.
_NOT_TYPED = frozenset({"enum", "const", "anyOf", "oneOf", "allOf", "not", "$ref", "$dynamicRef", "$recursiveRef",
                        "if", "then", "else", "nullable", "extends", "disallow"})


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
        verdicts = [c(values) for c in map(quick_checker, parts) if c is not None]
        return frozenset(value_key(v) for v, *said in zip(values, *verdicts) if False not in said)
    return None


def _refuses_all(schema: dict, value_keys: frozenset[str]) -> bool:
    """Every value (as value_key JSON) is known to be invalid against `schema`."""
    checker = quick_checker(schema)
    return checker is not None and all(ok is False for ok in checker([json.loads(v) for v in value_keys]))


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


# Classes whose automata approximate Python's Unicode-aware meaning, and inline flags: an
# empty intersection of the automata proves nothing then.
_APPROXIMATE = re.compile(r"\\[dDwWsSbB]|\(\?[a-zA-Z]")


def _props(s: dict) -> dict:
    p = s.get("properties")
    return p if isinstance(p, dict) else {}


def _closed(s: dict) -> bool:
    return s.get("additionalProperties") is False and not s.get("patternProperties")


def _forbids_extra(s: dict, name: str) -> bool:
    """`s` refuses a member `name` it does not declare: no extra members, and no pattern of its
    patternProperties matches the name."""
    if s.get("additionalProperties") is not False:
        return False
    patterns = s.get("patternProperties") or {}
    if not isinstance(patterns, dict) or any(_APPROXIMATE.search(p) for p in patterns):
        return False        # the automaton's keys may then differ from what `re` matches
    try:
        return not any(re.search(p, name) for p in patterns)
    except (re.error, TypeError):
        return False


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


class _Branches:
    """What is known about the resolved branches of one oneOf."""

    def __init__(self, branches: list, resolve: Callable[[object, str], object], open_types: bool) -> None:
        self.branches = branches
        self.resolve = resolve
        self.made = [_kinds(b, resolve, not open_types) for b in branches]    # types generated
        self.admitted = [_kinds(b, resolve, False) for b in branches]         # types validated

    def apart(self, i: int, j: int) -> bool:
        """Nothing generated from branch i is valid against branch j."""
        x, y = self.branches[i], self.branches[j]
        made = self.made[i]
        if not (made & self.admitted[j]):
            return True
        if not (isinstance(x, dict) and isinstance(y, dict)):
            return False
        vx, vy = _values(x), _values(y)
        if vx is not None and (vy is not None and not (vx & vy) or _refuses_all(y, vx)):
            return True
        if vy is not None and _refuses_all(x, vy):
            return True     # y admits only values x refuses
        if made == {"object"}:
            required = x.get("required") if isinstance(x.get("required"), list) else []
            if any(self._separates(x, n, y) for n in required if n in _props(x) or not _closed(x)):
                return True
            # y requires a member x never writes
            needed = y.get("required") if isinstance(y.get("required"), list) else []
            return any(_props(x).get(n) is False or (n not in _props(x) and _forbids_extra(x, n)) for n in needed)
        if made == {"string"}:
            return _patterns_apart(x, y)
        if made <= {"number"}:
            ix, iy = _interval(x), _interval(y)
            return ix[1] < iy[0] or iy[1] < ix[0]
        return False

    def _separates(self, x: dict, name: str, y: dict) -> bool:
        """An object with member `name` (valid for x) is refused by y."""
        mine, theirs = _props(x).get(name), _props(y).get(name, None if _forbids_extra(y, name) else True)
        if theirs is None or theirs is False:
            return mine is not False
        vx, vy = _values(self._look(mine)), _values(self._look(theirs))
        return vx is not None and vy is not None and not (vx & vy)

    def _look(self, schema: object) -> object:
        try:
            return self.resolve(schema, "")
        except SchemaError:
            return None

    def narrowed(self, i: int, sub: object, others: list[int]) -> object | None:
        """Branch i (written `sub`) narrowed to what no branch in `others` admits: False when
        another branch admits all it generates (it adds no valid document), None when it
        cannot be narrowed."""
        x = self.branches[i]
        if any(self._subsumes(j, i) for j in others):
            return False
        if not isinstance(x, dict) or _kinds(x, self.resolve, True) != {"object"}:
            return None
        objects = [self.branches[j] for j in others if "object" in self.admitted[j]]
        if not all(isinstance(y, dict) for y in objects):
            return None
        if not objects:     # the others admit no object: objects only
            return {"allOf": [sub, {"type": "object"}]}
        names = [n for n in _props(x) if all(self._separates(x, n, y) for y in objects)]
        if not names:
            return None
        return {"anyOf": [{"allOf": [sub, {"type": "object", "required": [n]}]} for n in names[:_MAX_SEPARATORS]]}

    def _subsumes(self, j: int, i: int) -> bool:
        """Every value branch i generates is valid against branch j: j's keywords only
        constrain types that i does not generate (e.g. an untyped object schema and strings)."""
        y = self.branches[j]
        if y is True:
            return True
        if not isinstance(y, dict) or "type" in y or set(y) & _NOT_TYPED:
            return False
        constrained = {t for t, kws in TYPE_KEYWORDS.items() if set(y) & kws}
        return not (self.made[i] & {"number" if t == "integer" else t for t in constrained})


def disjoint_branches(subs: list, ptr: str, resolve: Callable[[object, str], object], open_types: bool) -> list:
    """The branches to generate from (False for a dropped one): `subs` when every ordered pair
    is proven apart, else narrowed as the module says; raises when nothing would be left."""
    info = _Branches([resolve(s, f"{ptr}/oneOf/{i}") for i, s in enumerate(subs)], resolve, open_types)
    out = list(subs)
    for i, x in enumerate(info.branches):
        if x is False:
            continue
        unproven = [j for j, y in enumerate(info.branches) if j != i and y is not False and not info.apart(i, j)]
        if unproven:
            out[i] = info.narrowed(i, subs[i], unproven)
            if out[i] is None:
                raise unsupported("oneOf", ptr, "cannot prove the branches disjoint; use anyOf if overlap is acceptable")
    return out
