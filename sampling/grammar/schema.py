"""JSON Schema -> IR rules (rule 0 is the document; the others are called from it).

A `$ref` whose target can reach itself becomes a rule, and each use a `Call` (a pushdown call
at match time); so does a large target used more than once, and a large array item repeated
many times. Other references are inlined. "Any JSON value" is a recursive rule too.
References are in references.py, arrays in arrays.py, objects in objects.py (mixins); this
file stays over 300 lines because the keyword dispatch (node) and the rules for the other types
call one another.
"""
from __future__ import annotations

import functools
import math
import re
from itertools import compress, islice
from typing import Callable

import jsonschema
import referencing.exceptions

from . import ir, jsonstr, numeric
from .allof import with_all_of
from .errors import SchemaError, SchemaTooLarge, UnsupportedSchemaError, unsupported
from .formats import FORMATS, REFUSED_FORMATS
from .keywords import (JSON_TYPES, REFUSED, TYPE_KEYWORDS, BatchCheck, constraint_keys, count_keyword, dump_json,
                       quick_checker, value_key)
from .products import intersection
from .arrays import ArrayRules
from .objects import ObjectRules
from .references import ReferenceRules
from .regex import counted_split, length_bounded_pattern, pattern_ir, search_ir, search_pattern

# Length bounds up to this are unrolled one character at a time (exact distances); larger
# ones use a counter beside the automaton (counting.py). Where a counter cannot be used
# (dfa.CountConflict), larger bounds are tightened to this (maxLength) or refused (minLength).
MAX_COUNTED = 32
# A pattern or format that length_bounded_pattern cannot tighten runs beside a character
# counter instead, for bounds up to this.
MAX_LENGTH_PRODUCT = 64
# Sub-schemas compiled (merges revisit theirs): past this the automaton would be past its state
# limit anyway (the largest schemas that compile stay well below), so stop early.
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


class SchemaCompiler(ReferenceRules, ArrayRules, ObjectRules):
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
        self._checkers: dict[int, tuple[object, BatchCheck | None]] = {}
        self.nodes_built = 0
        self.unique_rules: dict[int, int] = {}   # array rules whose items unique.py keeps distinct: kind

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
            # All the branches' values checked in one call; the loop below makes no call per
            # enum branch (one anyOf of task names can meet hundreds of siblings).
            every = [v for values in branch_values if values is not None for v in values]
            verdicts = iter(check_siblings(every) if every else ())
            for i, (sub, values) in enumerate(zip(subs, branch_values)):
                mine = None if values is None else list(islice(verdicts, len(values)))
                if mine is not None and None not in mine:
                    # An enum branch under simple siblings: its values filtered, no merge (an
                    # anyOf of task names under each of many patterns is that product of merges).
                    kept = list(compress(values, mine))
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

    def _quick_checker(self, schema: object) -> BatchCheck | None:
        """keywords.quick_checker, built once per sub-schema in this compile: reading a long enum
        again per check was quadratic."""
        return _by_identity(self._checkers, schema, quick_checker)

    def _valid(self, values: list, schema: dict, ptr: str) -> list[bool]:
        """Whether each value is valid against `schema` (a sub-schema of the root, $refs resolved
        there)."""
        checker = self._quick_checker(schema)
        verdicts = [None] * len(values) if checker is None else checker(values)
        if None not in verdicts:
            return verdicts
        if self._validator is None:
            root = self.root if isinstance(self.root, (dict, bool)) else {}
            cls = jsonschema.validators.validator_for(root, default=jsonschema.Draft202012Validator)
            self._validator = cls(root, format_checker=cls.FORMAT_CHECKER)
        try:
            validator = self._validator.evolve(schema=schema)
            return [validator.is_valid(v) if ok is None else ok for v, ok in zip(values, verdicts)]
        except (jsonschema.exceptions.SchemaError, referencing.exceptions.Unresolvable,
                ValueError, TypeError, LookupError, RecursionError) as e:
            raise SchemaError(f"cannot check the enum/const values at {ptr or '/'}: {e}") from None

    def _filtered_enum(self, schema: dict, keys: set[str], ptr: str, nullable: bool) -> object:
        values = schema["enum"] if "enum" in schema else [schema["const"]]
        if not isinstance(values, list) or not values:
            raise SchemaError(f"'enum' at {ptr or '/'} must be a non-empty array")
        rule = {k: v for k, v in schema.items() if k != "nullable"}
        ok = iter(self._valid([v for v in values if not (nullable and v is None)], rule, ptr))
        kept = [v for v in values if (nullable and v is None) or next(ok)]
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
