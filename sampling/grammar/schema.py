"""JSON Schema -> IR rules (rule 0 is the document; other rules are recursive $ref targets).

Non-recursive references are inlined. A `$ref` whose target can reach itself becomes a rule,
and each use a `Call` (a pushdown call at match time). "Any JSON value" is a recursive rule too.
"""
from __future__ import annotations

import json
import math
from urllib.parse import unquote

from . import ir, jsonstr, numeric, utf8
from .allof import merge_all_of
from .errors import SchemaError, unsupported
from .formats import FORMATS
from .keywords import ANNOTATIONS, JSON_TYPES, SUPPORTED, TYPE_KEYWORDS, constraint_keys, escape_pointer
from .regex import pattern_ir

_COMPACT = {"separators": (",", ":"), "ensure_ascii": False, "allow_nan": False}
NULL, TRUE, FALSE = ir.lit(b"null"), ir.lit(b"true"), ir.lit(b"false")


def _dump(v) -> bytes:
    return json.dumps(v, **_COMPACT).encode("utf-8", "surrogatepass")


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


def _count(schema: dict, key: str, ptr: str) -> int | None:
    v = schema.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or v != int(v):
        raise SchemaError(f"{key!r} at {ptr or '/'} must be a non-negative integer")
    return int(v)


class SchemaCompiler:
    def __init__(self, root: object) -> None:
        self.root = root
        self.rules: list[object | None] = [None]
        self.ref_rule: dict[str, int] = {}
        self.inline_memo: dict[str, object] = {}
        self.literals: set[bytes] = {b"true", b"false", b"null", b"{}", b"[]", b'""'}
        self.recursive = self._recursive_refs()

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

    def _recursive_refs(self) -> set[str]:
        """Targets of $ref that can reach themselves through further $refs."""
        edges: dict[str, set[str]] = {}

        def refs_in(node) -> set[str]:
            out, todo = set(), [node]
            while todo:
                n = todo.pop()
                if isinstance(n, dict):
                    if isinstance(n.get("$ref"), str):
                        out.add(n["$ref"])
                    todo.extend(n.values())
                elif isinstance(n, list):
                    todo.extend(n)
            return out

        todo = list(refs_in(self.root))
        while todo:
            r = todo.pop()
            if r in edges:
                continue
            try:
                edges[r] = refs_in(self._resolve_pointer(r, ""))
            except SchemaError:
                edges[r] = set()  # reported with a proper location when compiled
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
        return rec

    def _ref(self, ref: str, ptr: str) -> object:
        target = self._resolve_pointer(ref, ptr)
        where = "#" + unquote(ref[1:])
        if ref in self.recursive:
            idx = self.ref_rule.get(ref)
            if idx is None:
                idx = self.ref_rule[ref] = len(self.rules)
                self.rules.append(None)
                self.rules[idx] = self.node(target, where)
            return ir.Call(idx)
        if ref not in self.inline_memo:
            self.inline_memo[ref] = self.node(target, where)
        return self.inline_memo[ref]

    def _resolve_schema(self, sub: object, where: str) -> object:
        """Follow $refs (for allOf / oneOf analysis); recursive targets cannot be merged."""
        for _ in range(64):
            if not (isinstance(sub, dict) and "$ref" in sub):
                return sub
            if constraint_keys(sub) - {"$ref"}:
                raise unsupported("$ref", where, "sibling keywords next to $ref")
            if sub["$ref"] in self.recursive:
                raise unsupported("allOf", where, "recursive $ref inside allOf")
            sub = self._resolve_pointer(sub["$ref"], where)
        raise SchemaError(f"'$ref' chain too long at {where or '/'}")

    def any_value(self) -> object:
        idx = self.ref_rule.get("")
        if idx is None:
            idx = self.ref_rule[""] = len(self.rules)
            self.rules.append(None)
            value = ir.Call(idx)
            key = ir.seq(ir.lit(b'"'), ir.Repeat(jsonstr.any_char(), 0, None), ir.lit(b'"'))
            self.rules[idx] = ir.alt(
                ir.Obj((), ir.seq(key, ir.lit(b":"), value)),
                self._array([], value, 0, None),
                self._string({}, ""), numeric.number(), TRUE, FALSE, NULL)
        return ir.Call(idx)

    # ---------------------------------------------------------------- schemas
    def compile(self) -> list[object]:
        if self.root is None:   # json_object mode: any JSON object
            self.rules[0] = self.node({"type": "object"}, "")
        else:
            self.rules[0] = self.node(self.root, "")
        return list(self.rules)

    def node(self, schema: object, ptr: str) -> object:
        if schema is True:
            return self.any_value()
        if schema is False:
            return ir.NEVER
        if not isinstance(schema, dict):
            raise SchemaError(f"schema at {ptr or '/'} must be an object or a boolean, got {type(schema).__name__}")
        for k in schema:
            if k not in SUPPORTED:
                raise unsupported(k, ptr)
        keys = constraint_keys(schema)
        if not keys:
            return self.any_value()
        if "$ref" in keys:
            if keys != {"$ref"}:
                raise unsupported("$ref", ptr, f"sibling keywords next to $ref: {sorted(keys - {'$ref'})}")
            return self._ref(schema["$ref"], ptr)
        if "allOf" in keys:
            return self.node(merge_all_of(schema, ptr, self._resolve_schema), ptr)
        nullable = schema.get("nullable", False)
        if not isinstance(nullable, bool):
            raise SchemaError(f"'nullable' at {ptr or '/'} must be a boolean")
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
        if t is None:   # infer from the keywords present; none at all = any type
            ts = [ty for ty in JSON_TYPES if ty != "integer" and keys & TYPE_KEYWORDS.get(ty, set())]
            return ts or [ty for ty in JSON_TYPES if ty != "integer"]
        ts = t if isinstance(t, list) else [t]
        if not ts or any(not isinstance(x, str) or x not in JSON_TYPES for x in ts) or len(set(ts)) != len(ts):
            raise SchemaError(f"invalid 'type' at {ptr or '/'}: {t!r}")
        if "number" in ts and "integer" in ts:
            ts = [x for x in ts if x != "integer"]
        return ts

    def _combinator(self, schema: dict, comb: str, keys: set[str], ptr: str, nullable: bool) -> object:
        others = keys - {comb, "nullable"}
        if others:
            raise unsupported(comb, ptr, f"sibling keywords next to {comb}: {sorted(others)}")
        subs = schema[comb]
        if not isinstance(subs, list) or not subs:
            raise SchemaError(f"{comb!r} at {ptr or '/'} must be a non-empty array")
        if comb == "oneOf" and len(subs) > 1:
            from .oneof import check_disjoint
            check_disjoint(subs, ptr, self._resolve_schema)
        body = ir.alt(*(self.node(s, f"{ptr}/{comb}/{i}") for i, s in enumerate(subs)))
        return ir.alt(NULL, body) if nullable else body

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
            c = _dump(schema["const"])
            values = [v for v in values if _dump(v) == c]
        if "type" in schema:
            ts = set(self._types(schema, keys, ptr))
            if "number" in ts:
                ts.add("integer")
            values = [v for v in values if _json_type(v) in ts]
        try:
            encoded = [_dump(v) for v in values]
        except ValueError as e:
            raise SchemaError(f"enum/const at {ptr or '/'} is not JSON: {e}") from None
        self.literals.update(encoded)
        return ir.alt(*(ir.lit(e) for e in encoded)) if encoded else ir.NEVER

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
        lo = _count(schema, "minLength", ptr) or 0
        hi = _count(schema, "maxLength", ptr)
        pattern, fmt = schema.get("pattern"), schema.get("format")
        if pattern is not None or fmt is not None:
            if pattern is not None and fmt is not None:
                raise unsupported("pattern", ptr, "pattern together with format")
            if "minLength" in schema or "maxLength" in schema:
                raise unsupported("pattern" if pattern is not None else "format", ptr,
                                  "combined with minLength/maxLength")
            if fmt is not None:
                if fmt not in FORMATS:
                    raise unsupported("format", ptr, f"format {fmt!r} (supported: {sorted(FORMATS)})")
                pattern = FORMATS[fmt]
            return ir.seq(ir.lit(b'"'), pattern_ir(pattern, ptr), ir.lit(b'"'))
        if hi is not None and hi < lo:
            return ir.NEVER
        # Counted strings use a smaller character automaton (no optional \uXXXX escapes): the
        # automaton is unrolled once per counted character, so its size matters.
        char = jsonstr.any_char() if hi is None and lo == 0 else jsonstr.char(jsonstr.ANY_RANGES)
        return ir.seq(ir.lit(b'"'), ir.Repeat(char, lo, hi), ir.lit(b'"'))

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
        if t == "integer":
            if lo is None and hi is None:
                return numeric.integer()
            ilo = None if lo is None else (math.floor(lo) + 1 if lo_x else math.ceil(lo))
            ihi = None if hi is None else (math.ceil(hi) - 1 if hi_x else math.floor(hi))
            if ilo is not None and ihi is not None and ihi < ilo:
                return ir.NEVER
            return numeric.integer_range(ilo, ihi)
        if lo is None and hi is None:
            return numeric.number()
        return numeric.bounded_number(lo, lo_x, hi, hi_x)

    # ---------------------------------------------------------------- arrays
    def _array_schema(self, schema: dict, ptr: str) -> object:
        items = schema.get("items")
        prefix = schema.get("prefixItems", [])
        rest_key = "items"
        if isinstance(items, list):       # draft-4..2019 tuple form
            if "prefixItems" in schema:
                raise SchemaError(f"array-valued 'items' together with 'prefixItems' at {ptr or '/'}")
            prefix, items, rest_key = items, schema.get("additionalItems"), "additionalItems"
        elif "additionalItems" in schema:
            raise unsupported("additionalItems", ptr, "only meaningful with array-valued 'items'")
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
        lo = _count(schema, "minItems", ptr) or 0
        hi = _count(schema, "maxItems", ptr)
        return self._array(pre, rest, lo, hi)

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

    # ---------------------------------------------------------------- objects
    def _object(self, schema: dict, ptr: str) -> object:
        props = schema.get("properties", {})
        required = schema.get("required", [])
        if not isinstance(props, dict):
            raise SchemaError(f"'properties' at {ptr or '/'} must be an object")
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise SchemaError(f"'required' at {ptr or '/'} must be an array of strings")
        # Absent additionalProperties: extra members allowed only when no properties are
        # declared (documented restriction; output stays valid).
        extra = schema.get("additionalProperties", "properties" not in schema)
        if not isinstance(extra, (bool, dict)):
            raise SchemaError(f"'additionalProperties' at {ptr or '/'} must be a schema")
        members = []
        for name, sub in props.items():
            value = self.node(sub, f"{ptr}/properties/{escape_pointer(name)}")
            members.append((self._member(name, value), name in required))
        for name in dict.fromkeys(required):
            if name in props:
                continue
            if extra is False:
                raise SchemaError(f"no JSON document satisfies this schema: {name!r} is required "
                                  f"but additionalProperties is false at {ptr or '/'}")
            value = self.node(extra, f"{ptr}/additionalProperties")
            members.append((self._member(name, value), True))
        extra_ir = None
        if extra is not False:
            names = list(props) + [r for r in required if r not in props]
            value = self.node(extra, f"{ptr}/additionalProperties")
            extra_ir = ir.seq(_key_not_in(names), ir.lit(b":"), value)
        return ir.Obj(tuple(members), extra_ir)

    def _member(self, name: str, value: object) -> object:
        key = _dump(name) + b":"
        self.literals.add(key)
        return ir.seq(ir.lit(key), value)


_RAW = [(0x20, 0x21), (0x23, 0x5B), (0x5D, utf8.MAX_CP)]   # characters JSON lets us write unescaped


def _key_not_in(names: list[str]) -> object:
    """A quoted key of unescaped characters that differs from every name (so an extra member
    can never repeat a declared property)."""
    trie: dict = {}
    for name in names:
        if all(any(lo <= ord(c) <= hi for lo, hi in _RAW) for c in name):
            node = trie
            for c in name:
                node = node.setdefault(ord(c), {})
            node[None] = True
    any_raw = ir.Repeat(ir.chars(_RAW), 0, None)
    alts = []

    def visit(node: dict, prefix: list) -> None:
        if None not in node:
            alts.append(ir.seq(*prefix))
        children = [c for c in node if c is not None]
        others = utf8.subtract(_RAW, [(c, c) for c in children])
        alts.append(ir.seq(*prefix, ir.chars(others), any_raw))
        for c in children:
            visit(node[c], prefix + [ir.chars([(c, c)])])

    visit(trie, [])
    return ir.seq(ir.lit(b'"'), ir.alt(*alts), ir.lit(b'"'))
