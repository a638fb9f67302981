"""Thompson construction: IR -> NFA with byte-set edges, epsilon edges and call edges."""
from __future__ import annotations

from . import ir

Frag = tuple[int, int]  # (start state, end state)


class NFA:
    def __init__(self) -> None:
        self.eps: list[list[int]] = []
        self.edges: list[list[tuple[int, int]]] = []   # (byte mask, target)
        self.calls: list[list[tuple[int, int]]] = []   # (rule, return target)

    def new(self) -> int:
        self.eps.append([])
        self.edges.append([])
        self.calls.append([])
        return len(self.eps) - 1

    def build(self, node) -> Frag:
        s = self.new()
        e = self._into(node, s)
        return s, e

    def _into(self, node, s: int) -> int:
        """Instantiate `node` starting at state `s`; return its end state."""
        if isinstance(node, ir.Bytes):
            e = self.new()
            self.edges[s].append((node.mask, e))
            return e
        if isinstance(node, ir.Seq):
            for it in node.items:
                s = self._into(it, s)
            return s
        if isinstance(node, ir.Alt):
            e = self.new()
            for it in node.items:
                a = self.new()
                self.eps[s].append(a)
                self.eps[self._into(it, a)].append(e)
            return e
        if isinstance(node, ir.Repeat):
            return self._repeat(node, s)
        if isinstance(node, ir.Call):
            e = self.new()
            self.calls[s].append((node.rule, e))
            return e
        if isinstance(node, ir.Obj):
            return self._obj(node, s)
        raise TypeError(f"unknown IR node {node!r}")

    def _repeat(self, node: ir.Repeat, s: int) -> int:
        for _ in range(node.lo):
            s = self._into(node.item, s)
        if node.hi is None:
            hub = self.new()
            self.eps[s].append(hub)
            self.eps[self._into(node.item, hub)].append(hub)
            return hub
        end = self.new()
        for _ in range(node.hi - node.lo):
            self.eps[s].append(end)
            s = self._into(node.item, s)
        self.eps[s].append(end)
        return end

    def _obj(self, node: ir.Obj, s: int) -> int:
        comma = ir.lit(b",")
        lo, hi = node.lo, node.hi
        top = hi if hi is not None else lo       # counts above `top` saturate (no upper bound)

        def bump(c: int) -> int | None:
            if hi is None:
                return min(c + 1, top)
            return c + 1 if c + 1 <= hi else None

        s = self._into(ir.lit(node.open), s)
        # `first`: nothing emitted yet; rest[c]: something emitted, c members counted.
        first, rest = s, [self.new() for _ in range(top + 1)]
        for member, required in node.members:
            nfirst, nrest = self.new(), [self.new() for _ in range(top + 1)]
            for c in range(top + 1):
                nc = bump(c)
                if nc is None:
                    continue
                mid = self.new()                  # just before the member's own bytes
                if c == 0:
                    self.eps[first].append(mid)
                self.eps[self._into(comma, rest[c])].append(mid)
                self.eps[self._into(member, mid)].append(nrest[nc])
            if not required:                      # skipping keeps the count
                self.eps[first].append(nfirst)
                for c in range(top + 1):
                    self.eps[rest[c]].append(nrest[c])
            first, rest = nfirst, nrest
        if node.extra is not None:
            for c in range(top + 1):
                nc = bump(c) if node.extra_counts else c
                if nc is None:
                    continue
                mid = self.new()
                if c == 0:
                    self.eps[first].append(mid)
                self.eps[self._into(comma, rest[c])].append(mid)
                self.eps[self._into(node.extra, mid)].append(rest[nc])
        end = self.new()
        if lo == 0:
            self.eps[self._into(ir.lit(node.close), first)].append(end)
        for c in range(lo, top + 1):
            self.eps[self._into(ir.lit(node.close), rest[c])].append(end)
        return end
