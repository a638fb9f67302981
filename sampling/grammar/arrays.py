"""Arrays for SchemaCompiler: prefix and further items, length bounds, uniqueItems."""
from __future__ import annotations

from . import ir
from .errors import SchemaError, unsupported
from .keywords import constraint_keys, count_keyword, dump_json, value_key
from .unique import FREE, READ

# An array item that minItems / maxItems repeat over this many times becomes a rule called once
# per item instead of being copied.
MAX_UNROLLED_ITEMS = 16


class ArrayRules:
    """The array part of SchemaCompiler (a mixin: it uses the compiler's node(), rules,
    literals, any_value(), _shared(), _resolve_schema() and _valid())."""

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
            ok = iter(self._valid([v for v in values if not (nullable and v is None)], rule, where))
            values = [v for v in values if (nullable and v is None) or next(ok)]
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
