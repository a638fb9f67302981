"""`$ref` for SchemaCompiler: resolving pointers, which targets recurse, and when a target is
inlined, shared as a rule, or merged into an allOf."""
from __future__ import annotations

from collections import Counter
from urllib.parse import unquote

from . import ir
from .allof import merge_all_of, with_all_of
from .errors import SchemaError, unsupported
from .keywords import constraint_keys

# A $ref target used more than once becomes a rule when its IR has at least this many nodes.
SHARED_RULE_SIZE = 40


class ReferenceRules:
    """The reference part of SchemaCompiler (a mixin: it uses the compiler's root, node(),
    rules and the reference bookkeeping set up in its __init__)."""

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
