"""JSON Schema -> IR rules (rule 0 is the document; the others are called from it).

A `$ref` whose target can reach itself becomes a rule, and each use a `Call` (a pushdown call
at match time); so does a large target used more than once, and a large array item repeated
many times. Other references are inlined. "Any JSON value" is a recursive rule too.
Objects are in objects.py (ObjectRules); this file stays over 300 lines because the keyword
dispatch (node) and the per-type rules call one another.
"""
from __future__ import annotations

import functools
import math
import re
from collections import Counter
from typing import Callable
from urllib.parse import unquote

import jsonschema
import referencing.exceptions

from . import ir, jsonstr, numeric
from .allof import merge_all_of, with_all_of
from .errors import SchemaError, SchemaTooLarge, UnsupportedSchemaError, unsupported
from .formats import FORMATS, REFUSED_FORMATS
from .keywords import JSON_TYPES, REFUSED, TYPE_KEYWORDS, constraint_keys, count_keyword, dump_json, quick_checker, value_key
from .nfa import intersection
from .objects import ObjectRules
from .unique import FREE, READ
from .regex import counted_split, length_bounded_pattern, pattern_ir, search_ir, search_pattern

# Length bounds up to this are unrolled one character at a time (exact distances); larger
# ones use a counter beside the automaton (counting.py). Where a counter cannot be used
# (dfa.CountConflict), larger bounds are tightened to this (maxLength) or refused (minLength).
MAX_COUNTED = 32
# A pattern or format that length_bounded_pattern cannot tighten runs beside a character
# counter instead, for bounds up to this.
MAX_LENGTH_PRODUCT = 64
# A $ref target used more than once becomes a rule when its IR has at least SHARED_RULE_SIZE
# nodes; so does any array item that minItems / maxItems repeat over MAX_UNROLLED_ITEMS times.
SHARED_RULE_SIZE = 40
MAX_UNROLLED_ITEMS = 16
# Sub-schemas compiled (merges revisit theirs): past this the automaton would be past its state
# limit anyway (a WordPress theme.json: 31,000, 1.2 s before failing there; the largest schemas
# that compile: about 7,000), so stop early.
MAX_SCHEMA_NODES = 10_000
# enum / const lists of at least this many bytes are a rule of their own (_choice).
LARGE_ENUM_BYTES = 2048
NULL, TRUE, FALSE = ir.lit(b"null"), ir.lit(b"true"), ir.lit(b"false")


def _spellings(v) -> list[bytes]:
    """The JSON texts of an enum / const value: numbers compare by value, so 2.0 is also 2."""
    text = dump_json(v)
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e15:
        return [text, str(int(v)).encode()]
    return [text]


def _enum_values(sub: object) -> list | None:
    """The values of a branch that is only an `enum` / `const` (annotations aside), else None."""
    if not isinstance(sub, dict) or constraint_keys(sub) - {"enum", "const"} or not ("enum" in sub) ^ ("const" in sub):
        return None
    values = sub["enum"] if "enum" in sub else [sub["const"]]
    return values if isinstance(values, list) and values else None


def _by_identity(memo: dict, obj: object, build: Callable[[object], object]):
    """build(obj), kept in `memo` for this very object (holding it keeps its id from reuse)."""
    hit = memo.get(id(obj))
    if hit is None or hit[0] is not obj:
        hit = memo[id(obj)] = (obj, build(obj))
    return hit[1]


def _json_type(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int) or (isinstance(v, float) and v.is_integer()):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    return "array" if isinstance(v, list) else "object"


@functools.lru_cache(maxsize=1024)
def _repeat(char: object, lo: int, hi: int | None) -> object:
    """The same IR object for the same string body, so that its leaf automaton is found by
    identity (hashing an IR tree walks all of it)."""
    return ir.Repeat(char, lo, hi)


class SchemaCompiler(ObjectRules):
    """`open_objects`: how to read what the schema leaves unsaid. False (the default, as in
    OpenAI's strict mode): an absent `additionalProperties` allows no members besides those
    named by properties / required / patternProperties, and an absent `type` only the types
    the other keywords name. True: JSON Schema's meaning, any further member (of any value)
    and any type."""

    def __init__(self, root: object, *, open_objects: bool = False, count_strings: bool = True) -> None:
        self.root = root
        self.open_objects = open_objects
        # Drafts 3 to 7 ignore every keyword next to a "$ref"; 2019-09 on, they all apply.
        declared = root.get("$schema") if isinstance(root, dict) else None
        self.ref_alone = isinstance(declared, str) and re.search(r"draft-0[3-7]/", declared) is not None
        self.count_strings = count_strings
        self.any_order_spent = 0          # see ObjectRules._spend_on_any_order
        self._validator = None
        self.rules: list[object | None] = [None]
        self.ref_rule: dict[str, int] = {}
        self.ref_failed: dict[str, SchemaError] = {}
        self.inline_memo: dict[str, object] = {}
        self.enum_rules: dict[tuple[bytes, ...], ir.Call] = {}
        self.literals: set[bytes] = {b"true", b"false", b"null", b"{}", b"[]", b'""'}
        self.recursive, self.ref_uses = self._reference_graph()
        # Recursive refs being resolved for a merge / whose inlined content is being compiled
        # (in the current rule body) / inlined by the merge in progress.
        self._resolving: list[str] = []
        self._inlining: list[str] = []
        self._inlined: list[str] = []
        self.merged_memo: dict[int, tuple[dict, object]] = {}
        self._branch_values_memo: dict[int, tuple[list, list]] = {}
        self._checkers: dict[int, tuple[object, Callable[[object], bool | None] | None]] = {}
        self.nodes_built = 0
        self.unique_rules: dict[int, int] = {}   # array rules whose items unique.py keeps distinct: kind

    # ---------------------------------------------------------------- references
    def _resolve_pointer(self, ref: object, ptr: str) -> object:
        if not isinstance(ref, str):
            raise SchemaError(f"'$ref' at {ptr or '/'} must be a string")
        if not ref.startswith("#"):
            raise unsupported("$ref", ptr, f"only local references ('#/...') are supported, got {ref!r}")
        node = self.root
        frag = unquote(ref[1:])
        if frag and not frag.startswith("/"):
            raise unsupported("$ref", ptr, f"anchor references are not supported: {ref!r}")
        for tok in frag.split("/")[1:]:
            tok = tok.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and tok in node:
                node = node[tok]
            elif isinstance(node, list) and tok.isdigit() and int(tok) < len(node):
                node = node[int(tok)]
            else:
                raise SchemaError(f"'$ref' {ref!r} at {ptr or '/'} does not resolve")
        return node

    def _reference_graph(self) -> tuple[set[str], Counter]:
        """(targets of $ref that can reach themselves through further $refs; how many times
        each target is referred to, from the root and from every target once)."""
        edges: dict[str, Counter] = {}

        def refs_in(node) -> Counter:
            out, todo = Counter(), [node]
            while todo:
                n = todo.pop()
                if isinstance(n, dict):
                    if isinstance(n.get("$ref"), str):
                        out[n["$ref"]] += 1
                    todo.extend(n.values())
                elif isinstance(n, list):
                    todo.extend(n)
            return out

        uses = refs_in(self.root)
        todo = list(uses)
        while todo:
            r = todo.pop()
            if r in edges:
                continue
            try:
                edges[r] = refs_in(self._resolve_pointer(r, ""))
            except SchemaError:
                edges[r] = Counter()  # reported with a proper location when compiled
            uses.update(edges[r])
            todo.extend(edges[r])
        rec = set()
        for start in edges:
            seen, todo = set(), list(edges[start])
            while todo:
                r = todo.pop()
                if r == start:
                    rec.add(start)
                    break
                if r not in seen:
                    seen.add(r)
                    todo.extend(edges.get(r, ()))
        return rec, uses

    def _ref(self, ref: str, ptr: str) -> object:
        target = self._resolve_pointer(ref, ptr)
        where = "#" + unquote(ref[1:])
        if ref in self.recursive:
            if ref in self.ref_failed:
                raise self.ref_failed[ref]
            idx = self.ref_rule.get(ref)
            if idx is None:
                idx = self.ref_rule[ref] = len(self.rules)
                self.rules.append(None)
                outer, self._inlining = self._inlining, []   # a rule body is built once
                try:
                    self.rules[idx] = self.node(target, where)
                except SchemaError as e:
                    # The caller may drop the part that used it (a pattern's extra members);
                    # calls made meanwhile then match nothing, later uses raise again.
                    self.rules[idx] = ir.NEVER
                    self.ref_failed[ref] = e
                    raise
                finally:
                    self._inlining = outer
            return ir.Call(idx)
        if ref not in self.inline_memo:
            body = self.node(target, where)
            self.inline_memo[ref] = self._shared(body) if self.ref_uses.get(ref, 0) > 1 else body
        return self.inline_memo[ref]

    def _shared(self, body: object, min_size: int | None = None) -> object:
        """`body` for a place that repeats it: a large one becomes a rule, built once and called
        from every copy, instead of being copied into each (automaton size, compile time)."""
        min_size = SHARED_RULE_SIZE if min_size is None else min_size
        if isinstance(body, ir.Call) or ir.size(body, min_size) < min_size:
            return body
        self.rules.append(body)
        return ir.Call(len(self.rules) - 1)

    def _resolve_schema(self, sub: object, where: str) -> object:
        """Follow $refs (for enum analysis); recursive targets are refused."""
        return self._resolve(sub, where, inline_recursive=False)

    def _resolve_to_analyse(self, sub: object, where: str) -> object:
        """Follow $refs, recursive ones too, and merge a top-level allOf where it merges: to look
        at the schema only (oneOf analysis)."""
        mark = len(self._inlined)
        try:
            sub = self._resolve(sub, where, inline_recursive=True)
            if isinstance(sub, dict) and "allOf" in sub:
                try:
                    sub = merge_all_of(sub, where, self._resolve_for_merge)
                except SchemaError:
                    pass        # looked at as written: weaker, still sound
            return sub
        finally:
            del self._inlined[mark:]

    def _resolve_for_merge(self, sub: object, where: str) -> object:
        """Follow $refs for an allOf merge: a recursive target is inlined once (its own nested
        $refs stay calls), unless that would inline it inside itself without end."""
        return self._resolve(sub, where, inline_recursive=True)

    def _resolve(self, sub: object, where: str, inline_recursive: bool) -> object:
        resolve = self._resolve_for_merge if inline_recursive else self._resolve_schema
        for _ in range(64):
            if not (isinstance(sub, dict) and "$ref" in sub):
                return sub
            if constraint_keys(sub) - {"$ref"} and not self.ref_alone:
                merged = with_all_of(sub, "$ref", [{"$ref": sub["$ref"]}], where)
                return merge_all_of(merged, where, resolve)
            ref = sub["$ref"]
            if ref in self.recursive:
                if not inline_recursive or ref in self._resolving or ref in self._inlining:
                    raise unsupported("allOf", where, "recursive $ref inside allOf")
                self._resolving.append(ref)
                try:
                    target = resolve(self._resolve_pointer(ref, where), where)
                    if isinstance(target, dict) and "allOf" in target:
                        target = merge_all_of(target, where, resolve)
                finally:
                    self._resolving.pop()
                self._inlined.append(ref)
                return target
            sub = self._resolve_pointer(ref, where)
        raise SchemaError(f"'$ref' chain too long at {where or '/'}")

    def _merge(self, schema: dict, ptr: str) -> tuple[dict, list[str]]:
        """merge_all_of, and the recursive refs it inlined (see _node_inlining)."""
        mark = len(self._inlined)
        try:
            return merge_all_of(schema, ptr, self._resolve_for_merge), self._inlined[mark:]
        finally:
            del self._inlined[mark:]

    def _merged_node(self, written: dict, to_merge: dict, ptr: str) -> object:
        """node() of an allOf (or $ref with siblings) written in the schema as `written`. One that
        inlines a recursive ref is built once and called wherever it recurs: copies of it
        would multiply through the recursion."""
        memo = self.merged_memo.get(id(written))
        if memo is not None:
            return memo[1]
        merged, refs = self._merge(to_merge, ptr)
        body = self._node_inlining(merged, refs, ptr)
        if refs:
            body = self._shared(body)
            self.merged_memo[id(written)] = (written, body)    # holding `written` keeps its id
        return body

    def _node_inlining(self, merged: object, refs: list[str], ptr: str) -> object:
        """node(merged), where `merged` holds the inlined content of the recursive `refs`:
        while it compiles, those refs may not be inlined again (that would never end)."""
        self._inlining.extend(refs)
        try:
            return self.node(merged, ptr)
        finally:
            del self._inlining[len(self._inlining) - len(refs):]

    def any_value(self) -> object:
        idx = self.ref_rule.get("")
        if idx is None:
            idx = self.ref_rule[""] = len(self.rules)
            self.rules.append(None)
            value = ir.Call(idx)
            key = ir.seq(ir.lit(b'"'), ir.Leaf(ir.Repeat(jsonstr.any_char(), 0, None)), ir.lit(b'"'))
            self.rules[idx] = ir.alt(
                ir.Obj((), ir.seq(key, ir.lit(b":"), value)),
                self._array([], value, 0, None),
                self._string({}, ""), ir.Leaf(numeric.number()), TRUE, FALSE, NULL)
        return ir.Call(idx)

    # ---------------------------------------------------------------- schemas
    def compile(self) -> list[object]:
        if self.root is None:   # json_object mode: any JSON object
            self.rules[0] = self.node({"type": "object"}, "")
        else:
            self.rules[0] = self.node(self.root, "")
        return list(self.rules)

    def node(self, schema: object, ptr: str) -> object:
        self.nodes_built += 1
        if self.nodes_built > MAX_SCHEMA_NODES:
            raise SchemaTooLarge(f"schema too large: more than {MAX_SCHEMA_NODES} sub-schemas to compile")
        if schema is True:
            return self.any_value()
        if schema is False:
            return ir.NEVER
        if not isinstance(schema, dict):
            raise SchemaError(f"schema at {ptr or '/'} must be an object or a boolean, got {type(schema).__name__}")
        keys = constraint_keys(schema)
        if not keys:
            return self.any_value()
        if "$ref" in keys and self.ref_alone:
            return self._ref(schema["$ref"], ptr)
        nullable = schema.get("nullable", False)
        if not isinstance(nullable, bool):
            raise SchemaError(f"'nullable' at {ptr or '/'} must be a boolean")
        if ("enum" in keys or "const" in keys) and keys - {"enum", "const", "type", "nullable"}:
            # A finite set of values: every other keyword is enforced exactly by validating them.
            return self._filtered_enum(schema, keys, ptr, nullable)
        refused = sorted(keys & REFUSED)
        if refused:
            raise unsupported(refused[0], ptr)
        if "$ref" in keys:
            if keys == {"$ref"}:
                return self._ref(schema["$ref"], ptr)
            # Sibling keywords next to $ref: both must hold (an implicit allOf).
            return self._merged_node(schema, with_all_of(schema, "$ref", [{"$ref": schema["$ref"]}], ptr), ptr)
        if "allOf" in keys:
            subs = schema["allOf"]
            if keys == {"allOf"} and isinstance(subs, list):
                live = [i for i, x in enumerate(subs) if x is not True and not (isinstance(x, dict) and not constraint_keys(x))]
                if len(live) == 1:   # nothing to merge: a lone $ref stays a call
                    return self.node(subs[live[0]], f"{ptr}/allOf/{live[0]}")
            return self._merged_node(schema, schema, ptr)
        for comb in ("anyOf", "oneOf"):
            if comb in keys:
                return self._combinator(schema, comb, keys, ptr, nullable)
        if "enum" in keys or "const" in keys:
            body = self._enum(schema, keys, ptr)
        else:
            body = ir.alt(*(self._typed(schema, t, ptr) for t in self._types(schema, keys, ptr)))
        return ir.alt(NULL, body) if nullable else body

    def _types(self, schema: dict, keys: set[str], ptr: str) -> list[str]:
        t = schema.get("type")
        if t is None:
            # JSON Schema: any type, each constrained by its own keywords. By default, only the
            # types the keywords name (`properties` asks for an object, not for any value).
            every = [ty for ty in JSON_TYPES if ty != "integer"]
            ts = [ty for ty in every if keys & TYPE_KEYWORDS.get(ty, set())]
            return every if self.open_objects or not ts else ts
        ts = t if isinstance(t, list) else [t]
        if not ts or any(not isinstance(x, str) or x not in JSON_TYPES for x in ts) or len(set(ts)) != len(ts):
            raise SchemaError(f"invalid 'type' at {ptr or '/'}: {t!r}")
        if "number" in ts and "integer" in ts:
            ts = [x for x in ts if x != "integer"]
        return ts

    def _combinator(self, schema: dict, comb: str, keys: set[str], ptr: str, nullable: bool) -> object:
        others = keys - {comb, "nullable"}
        subs = schema[comb]
        if not isinstance(subs, list) or not subs:
            raise SchemaError(f"{comb!r} at {ptr or '/'} must be a non-empty array")
        if others:
            # Sibling keywords (an implicit allOf) distribute over the branches; "exactly one
            # branch" is unchanged by intersecting every branch with the same schema.
            written = {k: v for k, v in schema.items() if k in others or k == comb}
            siblings = {k: v for k, v in schema.items() if k in others}
            merged, inlined = [], {}
            check_siblings = quick_checker(siblings)
            branch_values = self._branch_values(subs) if check_siblings is not None else [None] * len(subs)
            for i, (sub, values) in enumerate(zip(subs, branch_values)):
                verdicts = None if values is None else [check_siblings(v) for v in values]
                if verdicts is not None and None not in verdicts:
                    # An enum branch under simple siblings: its values filtered, no merge (an
                    # anyOf of 238 task names under each of 238 patterns is 57,000 merges).
                    kept = [v for v, ok in zip(values, verdicts) if ok]
                    merged.append({"enum": kept} if kept else False)
                    continue
                try:
                    where = f"{ptr}/{comb}/{i}"
                    branch, inlined[len(merged)] = self._merge(with_all_of(written, comb, [sub], where), where)
                    merged.append(branch)
                except UnsupportedSchemaError:
                    raise
                except SchemaError:
                    merged.append(False)       # this branch cannot match anything
            subs = merged
        else:
            inlined = {}
        if comb == "oneOf" and len(subs) > 1:
            from .oneof import disjoint_branches
            subs = disjoint_branches(subs, ptr, self._resolve_to_analyse, self.open_objects)
        body = ir.alt(*(self._node_inlining(s, inlined.get(i, []), f"{ptr}/{comb}/{i}")
                        for i, s in enumerate(subs) if s is not False))
        return ir.alt(NULL, body) if nullable else body

    def _branch_values(self, subs: list) -> list[list | None]:
        """_enum_values of each branch; one anyOf of task names can meet hundreds of siblings."""
        return _by_identity(self._branch_values_memo, subs, lambda s: [_enum_values(sub) for sub in s])

    def _quick_checker(self, schema: object) -> Callable[[object], bool | None] | None:
        """keywords.quick_checker, built once per sub-schema in this compile: its enum values are
        checked one at a time, and reading a long enum again per value was quadratic."""
        return _by_identity(self._checkers, schema, quick_checker)

    def _satisfies(self, value: object, schema: dict, ptr: str) -> bool:
        """`value` is valid against `schema` (a sub-schema of the root, $refs resolved there)."""
        checker = self._quick_checker(schema)
        quick = None if checker is None else checker(value)
        if quick is not None:
            return quick
        if self._validator is None:
            root = self.root if isinstance(self.root, (dict, bool)) else {}
            cls = jsonschema.validators.validator_for(root, default=jsonschema.Draft202012Validator)
            self._validator = cls(root, format_checker=cls.FORMAT_CHECKER)
        try:
            return self._validator.evolve(schema=schema).is_valid(value)
        except (jsonschema.exceptions.SchemaError, referencing.exceptions.Unresolvable,
                ValueError, TypeError, LookupError, RecursionError) as e:
            raise SchemaError(f"cannot check the enum/const values at {ptr or '/'}: {e}") from None

    def _filtered_enum(self, schema: dict, keys: set[str], ptr: str, nullable: bool) -> object:
        values = schema["enum"] if "enum" in schema else [schema["const"]]
        if not isinstance(values, list) or not values:
            raise SchemaError(f"'enum' at {ptr or '/'} must be a non-empty array")
        rule = {k: v for k, v in schema.items() if k != "nullable"}
        kept = [v for v in values if (nullable and v is None) or self._satisfies(v, rule, ptr)]
        try:
            encoded = list(dict.fromkeys(e for v in kept for e in _spellings(v)))
        except ValueError as e:
            raise SchemaError(f"enum/const at {ptr or '/'} is not JSON: {e}") from None
        return self._choice(encoded)

    def _choice(self, encoded: list[bytes]) -> object:
        """Exactly one of the JSON texts. A large list is one rule, called wherever the same list
        recurs (5,000 region codes in six places would otherwise be six copies of their trie)."""
        self.literals.update(encoded)
        if not encoded:
            return ir.NEVER
        body = ir.alt(*(ir.lit(e) for e in encoded))
        if sum(map(len, encoded)) < LARGE_ENUM_BYTES:
            return body
        key = tuple(encoded)
        if key not in self.enum_rules:
            self.rules.append(ir.Leaf(body))
            self.enum_rules[key] = ir.Call(len(self.rules) - 1)
        return self.enum_rules[key]

    def _enum(self, schema: dict, keys: set[str], ptr: str) -> object:
        others = keys - {"enum", "const", "type", "nullable"}
        if others:
            raise unsupported("enum" if "enum" in keys else "const", ptr,
                              f"combined with {sorted(others)} (only 'type' may accompany it)")
        if "enum" in schema:
            values = schema["enum"]
            if not isinstance(values, list) or not values:
                raise SchemaError(f"'enum' at {ptr or '/'} must be a non-empty array")
        else:
            values = [schema["const"]]
        if "const" in schema and "enum" in schema:
            c = value_key(schema["const"])       # 2 and 2.0 are one value; so are reordered objects
            values = [v for v in values if value_key(v) == c]
        if "type" in schema:
            ts = set(self._types(schema, keys, ptr))
            if "number" in ts:
                ts.add("integer")
            values = [v for v in values if _json_type(v) in ts]
        try:
            encoded = list(dict.fromkeys(e for v in values for e in _spellings(v)))
        except ValueError as e:
            raise SchemaError(f"enum/const at {ptr or '/'} is not JSON: {e}") from None
        return self._choice(encoded)

    def _typed(self, schema: dict, t: str, ptr: str) -> object:
        if t == "null":
            return NULL
        if t == "boolean":
            return ir.alt(TRUE, FALSE)
        if t == "string":
            return self._string(schema, ptr)
        if t in ("integer", "number"):
            return self._number(schema, t, ptr)
        if t == "array":
            return self._array_schema(schema, ptr)
        return self._object(schema, ptr)

    # ---------------------------------------------------------------- strings
    def _string(self, schema: dict, ptr: str) -> object:
        lo = count_keyword(schema, "minLength", ptr) or 0
        hi = count_keyword(schema, "maxLength", ptr)
        if hi is not None and hi < lo:
            return ir.NEVER
        pattern, fmt = schema.get("pattern"), schema.get("format")
        if fmt is not None:
            if not isinstance(fmt, str):
                raise SchemaError(f"'format' at {ptr or '/'} must be a string")
            if fmt in REFUSED_FORMATS:
                raise unsupported("format", ptr, f"format {fmt!r} is not enforced (supported: {sorted(FORMATS)})")
            if fmt not in FORMATS:
                fmt = None      # an unknown format is an annotation (JSON Schema)
        if pattern is not None or fmt is not None:
            if pattern is not None and fmt is not None:
                return self._pattern_and_format(pattern, fmt, lo, hi, ptr)
            split = counted_split(pattern, lo, hi) if pattern is not None and self.count_strings else None
            if split is not None and max(split[2], split[3] or 0) > MAX_COUNTED:
                # One class repeated many times: one copy of it beside a counter, not one per position.
                fixed, char, n_lo, n_hi = split
                if n_hi is not None and n_hi < n_lo:
                    return ir.NEVER
                pattern_ir(pattern, ptr)    # validates the whole pattern
                return ir.seq(ir.lit(b'"'), ir.Leaf(pattern_ir(fixed, ptr)) if fixed else ir.EMPTY,
                              ir.Counted(n_lo, n_hi, pattern_ir(char, ptr)), ir.lit(b'"'))
            if pattern is not None and not lo and hi is None:
                return ir.seq(ir.lit(b'"'), ir.Leaf(search_ir(pattern, ptr)), ir.lit(b'"'))
            keyword = "pattern" if pattern is not None else "format"
            # Formats match whole strings; a pattern matches anywhere in the string (JSON
            # Schema), unless only its whole-string reading (a subset) can be length-bounded.
            choices = [FORMATS[fmt]] if fmt is not None else [search_pattern(pattern), pattern]
            pattern = choices[0]
            if lo or hi is not None:
                bounded = next((b for b in (length_bounded_pattern(c, lo, hi, MAX_COUNTED) for c in choices)
                                if b is not None), None)
                if bounded is None:
                    return ir.seq(ir.lit(b'"'), self._counted_pattern(pattern, lo, hi, keyword, ptr), ir.lit(b'"'))
                pattern = bounded
            return ir.seq(ir.lit(b'"'), ir.Leaf(pattern_ir(pattern, ptr)), ir.lit(b'"'))
        if self.count_strings and (lo > MAX_COUNTED or (hi or 0) > MAX_COUNTED):
            return ir.seq(ir.lit(b'"'), ir.Counted(lo, hi), ir.lit(b'"'))
        if lo > MAX_COUNTED:
            raise unsupported("minLength", ptr, f"above {MAX_COUNTED} characters")
        if hi is not None and hi > MAX_COUNTED:
            hi = MAX_COUNTED     # longer strings are valid but not generated (documented restriction)
        # Counted strings use a smaller character automaton (no optional \uXXXX escapes): the
        # automaton is unrolled once per counted character, so its size matters.
        char = jsonstr.any_char() if hi is None and lo == 0 else jsonstr.counted_char()
        return ir.seq(ir.lit(b'"'), ir.Leaf(_repeat(char, lo, hi)), ir.lit(b'"'))

    def _counted_pattern(self, pattern: str, lo: int, hi: int | None, keyword: str, ptr: str) -> object:
        """The whole-string `pattern` within length bounds, as the product of its automaton and
        a character counter (when the bounds are small enough for the product to stay small)."""
        if max(lo, hi or 0) > MAX_LENGTH_PRODUCT:
            raise unsupported(keyword, ptr, "combined with minLength/maxLength")
        count = f"(?:.|\n){{{lo},{'' if hi is None else hi}}}"
        both = intersection(pattern_ir(pattern, ptr), pattern_ir(count, ptr))
        if both is None:
            raise unsupported(keyword, ptr, "combined with minLength/maxLength: too large an automaton")
        return both

    def _pattern_and_format(self, pattern: str, fmt: str, lo: int, hi: int | None, ptr: str) -> object:
        """Strings in the format that the pattern matches: both automata run side by side."""
        whole = FORMATS[fmt]
        if lo or hi is not None:
            whole = length_bounded_pattern(whole, lo, hi, MAX_COUNTED)
            if whole is None:
                raise unsupported("format", ptr, "combined with pattern and minLength/maxLength")
        both = intersection(pattern_ir(whole, ptr), search_ir(pattern, ptr))
        if both is None:
            raise unsupported("pattern", ptr, "together with format: too large an automaton")
        return ir.seq(ir.lit(b'"'), both, ir.lit(b'"'))

    # ---------------------------------------------------------------- numbers
    def _number(self, schema: dict, t: str, ptr: str) -> object:
        lo = hi = None
        lo_x = hi_x = False
        for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            v = schema.get(key)
            if v is None or (isinstance(v, bool) and key.startswith("exclusive")):
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise SchemaError(f"{key!r} at {ptr or '/'} must be a number")
            if key.endswith("inimum"):
                excl = key.startswith("exclusive") or schema.get("exclusiveMinimum") is True
                if lo is None or v > lo or (v == lo and excl):
                    lo, lo_x = v, excl
            else:
                excl = key.startswith("exclusive") or schema.get("exclusiveMaximum") is True
                if hi is None or v < hi or (v == hi and excl):
                    hi, hi_x = v, excl
        divisor = self._divisor(schema, ptr)
        if t == "integer" or divisor is not None:
            # (A whole divisor: integers only, also for "number": 5.0 is a multiple of 5, but
            # writing integers is enough.)
            ilo = None if lo is None else (math.floor(lo) + 1 if lo_x else math.ceil(lo))
            ihi = None if hi is None else (math.ceil(hi) - 1 if hi_x else math.floor(hi))
            if ilo is not None and ihi is not None and ihi < ilo:
                return ir.NEVER
            ints = numeric.integer() if lo is None and hi is None else numeric.integer_range(ilo, ihi)
            if divisor is None or divisor == 1:
                return ir.Leaf(ints)
            both = intersection(ints, numeric.multiples(divisor))
            if both is None:
                raise unsupported("multipleOf", ptr, "too many states with these bounds")
            return ir.Leaf(both) if any(both.accept) else ir.NEVER
        if lo is None and hi is None:
            return ir.Leaf(numeric.number())
        return ir.Leaf(numeric.bounded_number(lo, lo_x, hi, hi_x))

    @staticmethod
    def _divisor(schema: dict, ptr: str) -> int | None:
        m = schema.get("multipleOf")
        if m is None:
            return None
        if isinstance(m, bool) or not isinstance(m, (int, float)) or not m > 0:
            raise SchemaError(f"'multipleOf' at {ptr or '/'} must be a number above 0")
        # A fractional divisor is refused: validators divide in floating point (0.3 / 0.1 is
        # 2.9999999999999996), so which decimals pass is not decimal arithmetic.
        if not float(m).is_integer() or m > numeric.MAX_DIVISOR:
            raise unsupported("multipleOf", ptr, f"only whole divisors up to {numeric.MAX_DIVISOR}")
        return int(m)

    # ---------------------------------------------------------------- arrays
    def _array_schema(self, schema: dict, ptr: str) -> object:
        items = schema.get("items")
        prefix = schema.get("prefixItems", [])
        rest_key = "items"
        if isinstance(items, list):       # draft-4..2019 tuple form
            if "prefixItems" in schema:
                raise SchemaError(f"array-valued 'items' together with 'prefixItems' at {ptr or '/'}")
            prefix, items, rest_key = items, schema.get("additionalItems"), "additionalItems"
        # (additionalItems next to a schema-valued or absent `items` has no effect: ignored.)
        if not isinstance(prefix, list):
            raise SchemaError(f"'prefixItems' at {ptr or '/'} must be an array")
        pre = [self.node(s, f"{ptr}/prefixItems/{i}") for i, s in enumerate(prefix)]
        if items is None:
            # No schema for further items: any value if there is no prefix; none after a prefix
            # (a documented restriction that keeps tuples tight).
            rest = None if prefix else self.any_value()
        elif items is False:
            rest = None
        else:
            rest = self.node(items, f"{ptr}/{rest_key}")
        lo = count_keyword(schema, "minItems", ptr) or 0
        hi = count_keyword(schema, "maxItems", ptr)
        if schema.get("uniqueItems") is True and not (rest is None and len(pre) <= 1) and (hi is None or hi > 1):
            values = None if prefix else self._finite_values(items, f"{ptr}/items")
            if values is not None:
                # Distinct values of a finite set: each at most once, in the set's order.
                if hi is not None and hi >= len(values):
                    hi = None
                if max(lo, hi or 0) > 64:
                    raise unsupported("uniqueItems", ptr, "over 64 distinct values required")
                members = tuple((ir.lit(v), False) for v in values)
                self.literals.update(values)
                return ir.Obj(members, None, lo, hi, True, b"[", b"]") if len(values) >= lo else ir.NEVER
            if lo > 1:
                raise unsupported("uniqueItems", ptr, "items are not a finite set of values and minItems > 1")
            # The matcher keeps the items distinct (unique.py); the array is a rule of its own,
            # which tells the matcher where it is. Strings of any content are generated any
            # number at a time (a distinct one is always at hand); other items one at a time.
            kind = FREE if not prefix and self._free_string(items, f"{ptr}/items") else READ
            self.rules.append(self._array(pre, self._items_rule(rest, lo, hi), lo, hi))
            self.unique_rules[len(self.rules) - 1] = kind
            return ir.Call(len(self.rules) - 1)
        return self._array(pre, self._items_rule(rest, lo, hi), lo, hi)

    def _items_rule(self, rest: object | None, lo: int, hi: int | None) -> object | None:
        """An item repeated many times by the bounds is a rule called once per item."""
        if rest is not None and max(lo, hi or 0) > MAX_UNROLLED_ITEMS:
            return self._shared(rest, min_size=1)
        return rest

    def _resolved_dict(self, schema: object, where: str) -> dict | None:
        """`schema` with its $refs followed, when that gives a schema object (for a look at it)."""
        try:
            sub = self._resolve_schema(schema, where)
        except SchemaError:
            return None
        return sub if isinstance(sub, dict) else None

    def _free_string(self, items: object, where: str, strings_only: bool = False) -> bool:
        """`items` allows every string (but perhaps the empty one), and nothing else; with
        `strings_only`, True also for any schema allowing only strings (an anyOf branch)."""
        sub = self._resolved_dict(items, where)
        if sub is None:
            return False
        keys = constraint_keys(sub)
        if keys == {"anyOf"} and isinstance(sub["anyOf"], list):
            # A free string among branches of strings: every string again (anyOf, not oneOf).
            branches = sub["anyOf"]
            return (all(self._free_string(b, where, strings_only=True) for b in branches)
                    and any(self._free_string(b, where) for b in branches))
        if strings_only and ("enum" in keys or "const" in keys) and keys <= {"enum", "const", "type"}:
            values = sub["enum"] if "enum" in sub else [sub["const"]]
            return isinstance(values, list) and all(isinstance(v, str) for v in values)
        if sub.get("type") not in ("string", ["string"]):
            return False
        if strings_only:
            return True
        return keys <= {"type", "minLength"} and count_keyword(sub, "minLength", where) in (None, 0, 1)

    def _finite_values(self, items: object, where: str) -> list[bytes] | None:
        """The distinct JSON encodings an item may take, when `items` allows finitely many."""
        sub = self._resolved_dict(items, where)
        if sub is None:
            return None
        keys = constraint_keys(sub)
        if "enum" in keys or "const" in keys:
            values = sub["enum"] if "enum" in sub else [sub["const"]]
            if not isinstance(values, list):
                return None
            nullable = sub.get("nullable") is True
            rule = {k: v for k, v in sub.items() if k != "nullable"}
            values = [v for v in values if (nullable and v is None) or self._satisfies(v, rule, where)]
        elif keys == {"type"} and sub["type"] in ("boolean", "null"):
            values = [True, False] if sub["type"] == "boolean" else [None]
        else:
            return None
        seen, out = set(), []
        for v in values:
            key = value_key(v)
            if key not in seen:
                seen.add(key)
                out.append(dump_json(v))
        return out

    def _array(self, pre: list, rest: object | None, lo: int, hi: int | None) -> object:
        if rest is None or rest == ir.NEVER:
            hi = len(pre) if hi is None else min(hi, len(pre))
        if hi is not None and hi < lo:
            return ir.NEVER
        comma = ir.lit(b",")

        def tail(i: int) -> object:
            """Elements i.. (element i is preceded by a comma when i > 0)."""
            sep = comma if i else ir.EMPTY
            if hi is not None and i >= hi:
                return ir.EMPTY
            if i < len(pre):
                more = ir.seq(sep, pre[i], tail(i + 1))
                return more if i < lo else ir.opt(more)
            need = max(lo - i, 0)
            top = None if hi is None else hi - i
            if i == 0:
                first = ir.seq(rest, ir.Repeat(ir.seq(comma, rest), max(need - 1, 0), None if top is None else top - 1))
                return first if need else ir.opt(first)
            return ir.Repeat(ir.seq(comma, rest), need, top)

        return ir.seq(ir.lit(b"["), tail(0), ir.lit(b"]"))
