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
        s = self._into(ir.lit(b"{"), s)
        # (first, rest): state before member i when nothing / something was emitted yet.
        first, rest = s, self.new()
        for member, required in node.members:
            mid = self.new()                      # just before the member's own bytes
            self.eps[first].append(mid)
            self.eps[self._into(comma, rest)].append(mid)
            after = self._into(member, mid)
            nfirst, nrest = self.new(), self.new()
            self.eps[after].append(nrest)
            if not required:                      # skipping keeps the "emitted anything" flag
                self.eps[first].append(nfirst)
                self.eps[rest].append(nrest)
            first, rest = nfirst, nrest
        if node.extra is not None:
            mid = self.new()
            self.eps[first].append(mid)
            self.eps[self._into(comma, rest)].append(mid)
            self.eps[self._into(node.extra, mid)].append(rest)
        end = self.new()
        self.eps[self._into(ir.lit(b"}"), first)].append(end)
        self.eps[self._into(ir.lit(b"}"), rest)].append(end)
        return end
