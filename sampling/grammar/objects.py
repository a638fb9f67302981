"""Object keywords beyond properties / required: patternProperties, dependencies /
dependentRequired, and the key automaton for extra members.

Dependencies are rewritten into an `anyOf` of plain object schemas, one per subset of the
optional trigger properties present (triggers absent are forbidden, triggers present bring
their dependent properties or schema along): the variants are disjoint, so anyOf is exact.
"""
from __future__ import annotations

import functools
import itertools
import re

from . import ir, utf8
from .errors import SchemaError, SchemaTooLarge, unsupported
from .keywords import count_keyword, dump_json, escape_pointer
from .products import difference, intersection
from .regex import INEXACT, search_ir
from .thompson import leaf_dfa

MAX_TRIGGERS = 4          # 2**4 variants at most
ANY_ORDER_MAX = 6         # open objects: members in any order, tracking up to this many (2**6 sets)...
ANY_ORDER_BYTES = 16384   # ...while sets x key bytes (automaton size) over the schema stay under this
_RAW = [(0x20, 0x21), (0x23, 0x5B), (0x5D, utf8.MAX_CP)]   # characters JSON lets us write unescaped


def dependency_variants(schema: dict, ptr: str) -> list[dict] | None:
    """None when the schema has no dependencies; else object schemas whose union it is."""
    deps: dict[str, object] = {}
    for key in ("dependentRequired", "dependencies"):
        v = schema.get(key)
        if v is None:
            continue
        if not isinstance(v, dict):
            raise SchemaError(f"{key!r} at {ptr or '/'} must be an object")
        for name, dep in v.items():
            if isinstance(dep, list):
                if not all(isinstance(d, str) for d in dep):
                    raise SchemaError(f"{key!r} at {ptr or '/'}: {name!r} must list property names")
            elif key == "dependentRequired" or not isinstance(dep, (dict, bool)):
                raise SchemaError(f"{key!r} at {ptr or '/'}: {name!r} must be an array (or a schema)")
            deps.setdefault(name, [])
            deps[name] = deps[name] + [dep]
    if not deps:
        return None
    base = {k: v for k, v in schema.items() if k not in ("dependentRequired", "dependencies")}
    base["type"] = "object"
    required = list(base.get("required", []))
    if not isinstance(base.get("required", []), list):
        raise SchemaError(f"'required' at {ptr or '/'} must be an array of strings")
    # Required triggers always bring their dependencies; optional ones are enumerated.
    always, optional = [], []
    for name in deps:
        (always if name in required else optional).append(name)
    if len(optional) > MAX_TRIGGERS:
        raise unsupported("dependencies", ptr, f"more than {MAX_TRIGGERS} optional trigger properties")
    variants = []
    for present in itertools.product((False, True), repeat=len(optional)):
        on = always + [n for n, p in zip(optional, present) if p]
        off = [n for n, p in zip(optional, present) if not p]
        v = dict(base)
        props = dict(v.get("properties", {}))
        for name in off:
            props[name] = False
        v["properties"] = props
        req = list(required)
        extra_schemas = []
        for name in on:
            req.append(name)
            for dep in deps[name]:
                if isinstance(dep, list):
                    req.extend(dep)
                else:
                    extra_schemas.append(dep)
        v["required"] = list(dict.fromkeys(req))
        if any(s is False for s in extra_schemas):
            continue
        extra_schemas = [s for s in extra_schemas if s is not True]
        if extra_schemas:
            v = {"allOf": [v, *extra_schemas]}
        variants.append(v)
    return variants


def pattern_entries(schema: dict, ptr: str) -> list[tuple[str, object]]:
    pp = schema.get("patternProperties", {})
    if not isinstance(pp, dict):
        raise SchemaError(f"'patternProperties' at {ptr or '/'} must be an object")
    for p in pp:
        try:
            re.compile(p)
        except re.error as e:
            raise SchemaError(f"invalid patternProperties regex {p!r} at {ptr or '/'}: {e}") from None
    return list(pp.items())


def matching(name: str, patterns: list[tuple[str, object]]) -> list[object]:
    """Schemas of the patterns that `name` matches (JSON Schema: unanchored search)."""
    return [s for p, s in patterns if re.search(p, name)]


def literal_prefix(pattern: str) -> str | None:
    """'^abc' -> 'abc' (a pattern matching exactly the keys with that prefix); else None."""
    m = re.fullmatch(r"\^((?:[A-Za-z0-9_ ,;:@!%&'<>=/-]|\\[.$-])*)", pattern)
    return None if m is None else re.sub(r"\\(.)", r"\1", m.group(1))


@functools.lru_cache(maxsize=256)
def keys_overlap(p: str, q: str, max_states: int = 2000) -> bool:
    """Some key matches both patterns (True also when that cannot be settled cheaply)."""
    try:
        a, b = search_ir(p, ""), search_ir(q, "")
    except SchemaError:
        return True
    both = intersection(a, b, max_states)
    return both is None or any(both.accept)


def _raw(word: str) -> bool:
    return all(any(lo <= ord(c) <= hi for lo, hi in _RAW) for c in word)


@functools.lru_cache(maxsize=2)
def _free_key(escapes: bool) -> object:
    """Key characters after the key has left the names' trie. The escapes decode to characters
    that cannot be written raw (not `\\/`, not `\\u`), so they are offered only when every
    name is raw: a key holding one then differs from them all."""
    raw = ir.chars(_RAW)
    if escapes:
        raw = ir.alt(raw, ir.seq(ir.lit(b"\\"), ir.Bytes(ir.byte_mask(b'"\\bfnrt'))))
    return ir.Repeat(raw, 0, None)


def key_other_than(key: ir.Leaf, names: list[str], max_states: int = 20_000) -> ir.Table | None:
    """Key contents matched by `key` other than the names, as a DFA (the key's automaton run
    beside a trie of the names); None when a name has another spelling (an escape, `\\/`)
    the trie would miss, or the product grows too large."""
    if not all(_raw(n) and "/" not in n for n in names):
        return None
    return intersection(key.item, _any_bytes_but(names), max_states)


def _any_bytes_but(names: list[str]) -> ir.Table:
    """Every byte string except the names' UTF-8: their trie, and one state for off the trie."""
    trie: list[dict[int, int]] = [{}]
    ends = set()
    for name in names:
        node = 0
        for b in name.encode("utf-8"):
            nxt = trie[node].get(b)
            if nxt is None:
                nxt = trie[node][b] = len(trie)
                trie.append({})
            node = nxt
        ends.add(node)
    off, every = len(trie), (1 << 256) - 1
    edges = []
    for children in trie:
        rest = every
        for b in children:
            rest &= ~(1 << b)
        edges.append(tuple((1 << b, t) for b, t in children.items()) + ((rest, off),))
    edges.append(((every, off),))
    return ir.Table(tuple(edges), tuple(t not in ends for t in range(off + 1)))


def key_not_in(names: list[str], prefixes: tuple[str, ...] = ()) -> object:
    """A quoted key of unescaped characters that differs from every name and starts with none
    of the prefixes (so an extra member never repeats a declared one, nor falls under a
    patternProperties prefix), built directly as a small DFA (ir.Table): a byte trie of the
    names whose every other byte falls into one shared "any further characters" automaton."""
    free_edges, free_out = _free_key_states(all(_raw(w) for w in (*names, *prefixes)))
    # states: 0 = before the opening quote, 1 = after the closing quote, then the free
    # automaton's states (offset 2), then trie nodes.
    edges: list[dict[int, int]] = [{}, {}] + list(free_edges)   # shared, never changed here
    accept = [False, True] + [False] * len(free_edges)
    quote = ord('"')
    free_start = edges[2]

    def new_node(at_boundary: bool) -> int:
        edges.append(dict(free_start) if at_boundary else {})
        accept.append(False)
        if at_boundary:
            edges[-1][quote] = 1
        return len(edges) - 1

    root = new_node(True)
    edges[0][quote] = root
    kinds = {}
    for word, kind in [(n, "name") for n in names] + [(p, "prefix") for p in prefixes]:
        if not _raw(word):
            continue      # it could never be written unescaped, so no key can repeat it
        node, data = root, word.encode("utf-8")
        for j, b in enumerate(data):
            if kinds.get(node) == "prefix":
                break
            nxt = edges[node].get(b)
            if nxt is None or nxt < root:       # not yet a trie child: make one
                boundary = j + 1 == len(data) or not (0x80 <= data[j + 1] <= 0xBF)
                nxt = new_node(boundary)
                edges[node][b] = nxt
            node = nxt
        else:
            if kind == "prefix":
                edges[node] = {}      # nothing may follow: every key with this prefix is out
                kinds[node] = "prefix"
            elif kinds.get(node) != "prefix":
                edges[node].pop(quote, None)   # the name itself may not be the key
    out_edges = [_by_target(e) for e in edges[:2]] + list(free_out) + [_by_target(e) for e in edges[2 + len(free_out):]]
    return ir.Table(tuple(out_edges), tuple(accept))


def _by_target(edges: dict[int, int]) -> tuple[tuple[int, int], ...]:
    by_target: dict[int, int] = {}
    for b, t in edges.items():
        by_target[t] = by_target.get(t, 0) | (1 << b)
    return tuple((m, t) for t, m in sorted(by_target.items()))


@functools.lru_cache(maxsize=2)
def _free_key_states(escapes: bool) -> tuple[tuple[dict[int, int], ...], tuple]:
    """_free_key's automaton as states 2.. of key_not_in's table: per state its byte -> target
    map (a closing quote where it accepts), and the same as (mask, target) edges. Built once:
    expanding the masks byte by byte took most of key_not_in's time."""
    free_edges, free_accept = leaf_dfa(_free_key(escapes))
    states: list[dict[int, int]] = []
    for i, out in enumerate(free_edges):
        e = {b: 2 + t for mask, t in out for b in range(256) if mask >> b & 1}
        if free_accept[i]:
            e[ord('"')] = 1
        states.append(e)
    return tuple(states), tuple(_by_target(e) for e in states)


class ObjectRules:
    """The object part of SchemaCompiler (a mixin: it uses the compiler's node(), literals,
    open_objects and any_order_spent)."""

    def _object(self, schema: dict, ptr: str) -> object:
        variants = dependency_variants(schema, ptr)
        if variants is not None:
            return ir.alt(*(self.node(v, ptr) for v in variants))
        props = schema.get("properties", {})
        required = schema.get("required", [])
        if not isinstance(props, dict):
            raise SchemaError(f"'properties' at {ptr or '/'} must be an object")
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise SchemaError(f"'required' at {ptr or '/'} must be an array of strings")
        patterns = pattern_entries(schema, ptr)
        explicit = "additionalProperties" in schema
        # Absent additionalProperties: JSON Schema allows any extra member; by default (not
        # open_objects) no members besides the named ones are generated when any are named.
        extra = schema.get("additionalProperties",
                           self.open_objects or not ("properties" in schema or patterns))
        if not isinstance(extra, (bool, dict)):
            raise SchemaError(f"'additionalProperties' at {ptr or '/'} must be a schema")
        names = list(props) + [r for r in dict.fromkeys(required) if r not in props]
        # JSON Schema's reading (open_objects) lets members come in any order; tracked by the set
        # emitted so far, so only for a few members and no count bounds. Values are then called
        # rules: the automaton holds one copy per set. In larger objects only the required
        # members are tracked; the optional ones may then repeat, as extra members may.
        any_order = self.open_objects and len(names) > 1 and not {"minProperties", "maxProperties"} & set(schema)
        # The budget pays for the copies of the members beyond the one an ordered object has;
        # past it, a small object tracks only its required members, as larger ones do.
        key_bytes = sum(len(dump_json(n)) + 1 for n in names)
        only_required = [n for n in names if n in required]
        tracked = None
        for choice in ([names] if len(names) <= ANY_ORDER_MAX else []) + [only_required]:
            if any_order and len(choice) <= ANY_ORDER_MAX and self._spend_on_any_order(((1 << len(choice)) - 1) * key_bytes):
                tracked = choice
                break
        any_order = tracked is not None
        members = []
        for name in names:
            where = f"{ptr}/properties/{escape_pointer(name)}"
            parts = ([props[name]] if name in props else []) + (matching(name, patterns) if patterns else [])
            if not parts:   # a required name that no properties / patternProperties entry covers
                if extra is False and explicit:
                    raise SchemaError(f"no JSON document satisfies this schema: {name!r} is required "
                                      f"but additionalProperties is false at {ptr or '/'}")
                parts = [extra if explicit else True]
                where = f"{ptr}/additionalProperties"
            value = self.node(parts[0] if len(parts) == 1 else {"allOf": parts}, where)
            if any_order:
                value = self._shared(value, min_size=8)
            members.append((self._member(name, value), name in required))
        extras = [x for x in (self._pattern_member(p, i, patterns, names, ptr) for i, (p, _) in enumerate(patterns))
                  if x is not None]
        if extra is not False:
            prefixes = [literal_prefix(p) for p, _ in patterns]
            where = f"{ptr}/additionalProperties"
            if all(x is not None for x in prefixes):    # keys avoid the patterns' prefixes
                value = self.node(extra, where)
                extras.append(ir.seq(key_not_in(names, tuple(prefixes)), ir.lit(b":"), value))
            else:
                # A key may fall under some pattern: its value must satisfy every schema that
                # could apply (or such extras are not generated).
                try:
                    value = self.node({"allOf": [extra, *(s for _, s in patterns)]}, where)
                    extras.append(ir.seq(key_not_in(names), ir.lit(b":"), value))
                except SchemaTooLarge:
                    raise
                except SchemaError:
                    pass
        if any_order:
            untracked = frozenset(i for i, n in enumerate(names) if n not in tracked)
            return ir.Obj(tuple(members), ir.alt(*extras) if extras else None, any_order=True, untracked=untracked)
        return self._counted_members(schema, members, extras, ptr, anywhere=self.open_objects)

    def _spend_on_any_order(self, size: int) -> bool:
        if self.any_order_spent + size > ANY_ORDER_BYTES:
            return False
        self.any_order_spent += size
        return True

    def _pattern_member(self, pattern: str, i: int, patterns: list, names: list[str], ptr: str) -> object | None:
        """Extra members whose key fully matches `pattern`; None when they cannot be generated
        safely (a declared name matches it, or its value schemas do not combine): generating
        fewer members than allowed keeps output valid."""
        where = f"{ptr}/patternProperties/{escape_pointer(pattern)}"
        # The key may match other patterns too: its value must satisfy their schemas as well,
        # and a pattern whose schema is `false` forbids the keys it matches.
        others = [(q, s) for j, (q, s) in enumerate(patterns) if j != i and keys_overlap(pattern, q)]
        schemas = [patterns[i][1]] + [s for _, s in others if s is not False]
        try:
            key = search_ir(pattern, where)
            for q in (q for q, s in others if s is False):
                if INEXACT.search(q):    # \d \w \s are ASCII subsets here: too little taken away
                    return None
                key = difference(key, search_ir(q, where))
                if key is None:
                    return None
            key = ir.Leaf(key)
            value = self.node(schemas[0] if len(schemas) == 1 else {"allOf": schemas}, where)
        except SchemaTooLarge:
            raise
        except SchemaError:
            return None
        declared = [n for n in names if re.search(pattern, n)]
        if declared:        # an extra key may not repeat a declared name the pattern matches
            key = key_other_than(key, declared)
            if key is None:
                return None
        return ir.seq(ir.lit(b'"'), key, ir.lit(b'":'), value)

    def _counted_members(self, schema: dict, members: list, extras: list, ptr: str,
                         anywhere: bool = False) -> object:
        """`anywhere`: extras may come before and between the members too (JSON Schema's reading);
        they are then one called rule, not a copy at every place."""
        lo = count_keyword(schema, "minProperties", ptr) or 0
        hi = count_keyword(schema, "maxProperties", ptr)
        n_req = sum(1 for _, r in members if r)
        if lo <= n_req:
            lo = 0
        if hi is not None and not extras and hi >= len(members):
            hi = None
        if hi is not None and hi < max(lo, n_req):
            return ir.NEVER
        # Extra keys may repeat one another (not prevented), so towards minProperties they count
        # as one together (nfa.py); they do count towards maxProperties (a repeat only lowers
        # the count).
        if extras and lo and hi is not None:
            extras = []
        if max(lo, hi or 0) > 64:
            raise unsupported("minProperties" if lo > 64 else "maxProperties", ptr, "bounds above 64")
        extra_ir = ir.alt(*extras) if extras else None
        anywhere = anywhere and extra_ir is not None and lo == 0 and bool(members)
        if anywhere:
            extra_ir = self._shared(extra_ir, min_size=1)
        return ir.Obj(tuple(members), extra_ir, lo, hi, hi is not None, extras_anywhere=anywhere)

    def _member(self, name: str, value: object) -> object:
        key = dump_json(name) + b":"
        self.literals.add(key)
        return ir.seq(ir.lit(key), value)
