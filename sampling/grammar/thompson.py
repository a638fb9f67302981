"""Thompson construction: IR -> NFA; and the leaf automata (small minimal DFAs) it copies in."""
from __future__ import annotations

from itertools import groupby

import numpy as np

from . import dfa, ir, jsonstr
from .nfa import NFA, Frag


class Thompson(NFA):
    """An NFA built from IR nodes; every use of a node is instantiated afresh."""

    def build(self, node) -> Frag:
        s = self.new()
        e = self._into(node, s)
        return s, e

    def _into(self, node, s: int) -> int:
        """Instantiate `node` starting at state `s`; return its end state."""
        if isinstance(node, ir.Bytes):
            e = self.new()
            self.byte_edge(s, node, e)
            return e
        if isinstance(node, ir.Seq):
            for kind, run in groupby(node.items, type):
                if kind is ir.Bytes:    # literal bytes, most of a large schema: a chain in bulk
                    masks = list(run)   # a Bytes node is its own mask
                    first = self.n
                    self.n += len(masks)
                    self.edge_src.append(s)
                    self.edge_src.extend(range(first, self.n - 1))
                    self.edge_mask.extend(masks)
                    self.edge_dst.extend(range(first, self.n))
                    s = self.n - 1
                else:
                    for it in run:
                        s = self._into(it, s)
            return s
        if isinstance(node, ir.Alt):
            e = self.new()
            for it in node.items:
                a = self.new()
                self.link(s, a)
                self.link(self._into(it, a), e)
            return e
        if isinstance(node, ir.Repeat):
            return self._repeat(node, s)
        if isinstance(node, ir.Call):
            e = self.new()
            self.call_edge(s, node.rule, e)
            return e
        if isinstance(node, ir.Obj):
            return self._obj(node, s)
        if isinstance(node, ir.Leaf):
            return self._leaf(node, s)
        if isinstance(node, ir.Table):
            return self._copy(node.edges, node.accept, s)
        if isinstance(node, ir.Counted):
            return self._counted(node, s)
        raise TypeError(f"unknown IR node {node!r}")

    def _leaf(self, node: ir.Leaf, s: int) -> int:
        edges, accept = leaf_dfa(node.item)
        return self._copy(edges, accept, s)

    def _counted(self, node: ir.Counted, s: int) -> int:
        edges, accept = leaf_dfa(ir.Repeat(jsonstr.any_char() if node.char is None else node.char, 0, None))
        # Minimal DFA of char*: the start is the only accepting state, entered exactly when a
        # character is complete; the counter rides on that.
        assert accept[0] and not any(accept[1:])
        first = self.n
        end = self._copy(edges, accept, s)
        for i in range(len(edges)):
            self.counted[first + i] = (node.lo, node.hi, i == 0)
        return end

    def _copy(self, edges, accept, s: int) -> int:
        """A copy of a small DFA (per state: ((byte mask, target), ...); per state: accepting)
        from `s`: its edges appended in bulk, offset by the copy's first state."""
        first = self.n
        self.n += len(edges) + 1
        end = self.n - 1
        if edges:
            self.link(s, first)
        src, masks, dst, accepting = _flat(edges, accept)
        shift = first.__add__
        self.edge_src.extend(map(shift, src))
        self.edge_mask.extend(masks)
        self.edge_dst.extend(map(shift, dst))
        self.eps_src.extend(map(shift, accepting))
        self.eps_dst.extend([end] * len(accepting))
        return end

    def _repeat(self, node: ir.Repeat, s: int) -> int:
        for _ in range(node.lo):
            s = self._into(node.item, s)
        if node.hi is None:
            hub = self.new()
            self.link(s, hub)
            self.link(self._into(node.item, hub), hub)
            return hub
        end = self.new()
        for _ in range(node.hi - node.lo):
            self.link(s, end)
            s = self._into(node.item, s)
        self.link(s, end)
        return end

    def _obj(self, node: ir.Obj, s: int) -> int:
        if node.any_order:
            return self._any_order_obj(node, s)
        comma = ir.lit(b",")
        lo, hi = node.lo, node.hi
        top = hi if hi is not None else lo       # counts above `top` saturate (no upper bound)

        def bump(c: int) -> int | None:
            if hi is None:
                return min(c + 1, top)
            return c + 1 if c + 1 <= hi else None

        def extras(first: int, rest: list[int], after: list[int]) -> None:
            for c in range(top + 1):
                nc = bump(c)
                if nc is None:
                    continue
                mid = self.new()
                if c == 0:
                    self.link(first, mid)
                self.link(self._into(comma, rest[c]), mid)
                self.link(self._into(node.extra, mid), after[nc])

        s = self._into(ir.lit(node.open), s)
        # `first`: nothing emitted yet; rest[c]: something emitted, c members counted.
        first, rest = s, [self.new() for _ in range(top + 1)]
        for member, required in node.members:
            if node.extras_anywhere:
                extras(first, rest, rest)
            nfirst, nrest = self.new(), [self.new() for _ in range(top + 1)]
            for c in range(top + 1):
                nc = bump(c)
                if nc is None:
                    continue
                mid = self.new()                  # just before the member's own bytes
                if c == 0:
                    self.link(first, mid)
                self.link(self._into(comma, rest[c]), mid)
                self.link(self._into(member, mid), nrest[nc])
            if not required:                      # skipping keeps the count
                self.link(first, nfirst)
                for c in range(top + 1):
                    self.link(rest[c], nrest[c])
            first, rest = nfirst, nrest
        after = rest
        if node.extra is not None:
            # Extras come after the members. When they do not count one by one (they may repeat
            # each other's keys) they count as one together, their keys differing from every
            # declared member's: `after[c]` is "c counted, some extra emitted".
            after = rest if node.extra_counts or lo == 0 else [self.new() for _ in range(top + 1)]
            extras(first, rest, after)
            if after is not rest:
                for c in range(top + 1):
                    mid = self.new()
                    self.link(self._into(comma, after[c]), mid)
                    self.link(self._into(node.extra, mid), after[c])
        end = self.new()
        if lo == 0:
            self.link(self._into(ir.lit(node.close), first), end)
        closing = [rest] if after is rest else [rest, after]
        for counted in closing:
            for c in range(lo, top + 1):
                self.link(self._into(ir.lit(node.close), counted[c]), end)
        return end

    def _any_order_obj(self, node: ir.Obj, s: int) -> int:
        """One state per set of tracked members emitted so far (2**n: kept for small n by the
        caller); untracked members and extras leave the set as it is."""
        comma = ir.lit(b",")
        tracked = [i for i in range(len(node.members)) if i not in node.untracked]
        bit = {i: 1 << j for j, i in enumerate(tracked)}
        required = sum(bit[i] for i, (_, r) in enumerate(node.members) if r)
        start = self._into(ir.lit(node.open), s)
        emitted = [self.new() for _ in range(1 << len(tracked))]   # something emitted, these among it
        for mask in range(-1, 1 << len(tracked)):                  # -1: nothing emitted yet
            before = start if mask < 0 else self._into(comma, emitted[mask])
            have = max(mask, 0)
            for i, (member, _) in enumerate(node.members):
                b = bit.get(i, 0)
                if not have & b:
                    self.link(self._into(member, before), emitted[have | b])
            if node.extra is not None:
                self.link(self._into(node.extra, before), emitted[have])
        end = self.new()
        if not required:
            self.link(self._into(ir.lit(node.close), start), end)
        for mask in range(1 << len(tracked)):
            if mask & required == required:
                self.link(self._into(ir.lit(node.close), emitted[mask]), end)
        return end


LeafDFA = tuple[tuple[tuple[tuple[int, int], ...], ...], tuple[bool, ...]]
_LEAVES: dict[object, LeafDFA] = {}


def leaf_dfa(node) -> LeafDFA:
    """A DFA for `node` as (per state: ((byte mask, target), ...), per state: accepting); state 0 is
    the start. Memoised by IR value (IR nodes are immutable and hashable)."""
    by_id = _LEAVES_BY_ID.get(id(node))
    if by_id is not None and by_id[0] is node:
        return by_id[1]
    hit = _LEAVES.get(node)       # hashing an IR tree walks it all: the id lookup comes first
    if hit is not None:
        _remember(node, hit)
        return hit
    nfa = Thompson()
    try:
        result = _edge_lists(dfa.build(nfa, [nfa.build(node)], minimal=True))   # _counted relies on it
    except dfa.EmptyLanguage:
        result = ((),), (False,)
    if len(_LEAVES) > 4096:
        _LEAVES.clear()
    _LEAVES[node] = result
    _remember(node, result)
    return result


_LEAVES_BY_ID: dict[int, tuple[object, tuple]] = {}


def _remember(node, result) -> None:
    if len(_LEAVES_BY_ID) > 4096:
        _LEAVES_BY_ID.clear()
    _LEAVES_BY_ID[id(node)] = (node, result)     # holding `node` keeps its id from being reused


def _edge_lists(aut: dfa.Automaton) -> LeafDFA:
    """A one-rule automaton as leaf_dfa's result: its states reachable from the start, the start
    numbered 0, edges grouped by target into byte masks. Tuples of ints, which the garbage
    collector stops tracking: the leaf cache holds many."""
    start = aut.rule_start[0]
    number = {start: 0}
    order = [start]
    edges: list[list[tuple[int, int]]] = []
    for g in order:                       # grows while it is walked: breadth-first numbering
        row = aut.row(g)
        out = []
        for t in np.unique(row).tolist():
            if t == dfa.DEAD:
                continue
            if t not in number:
                number[t] = len(order)
                order.append(t)
            bits = np.packbits(row == t, bitorder="little").tobytes()
            out.append((int.from_bytes(bits, "little"), number[t]))
        edges.append(tuple(out))
    return tuple(edges), tuple(bool(aut.accept[g]) for g in order)


_FLAT: dict[int, tuple[object, tuple]] = {}


def _flat(edges, accept) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """A small DFA's edges as parallel columns (source, mask, target) and its accepting states,
    in state order: what _copy appends. Kept per table (a leaf's is copied at every use)."""
    hit = _FLAT.get(id(edges))
    if hit is not None and hit[0] is edges:
        return hit[1]
    pairs = [(i, mask, t) for i, out in enumerate(edges) for mask, t in out]
    src, masks, dst = (tuple(column) for column in zip(*pairs)) if pairs else ((), (), ())
    flat = src, masks, dst, tuple(i for i, a in enumerate(accept) if a)
    if len(_FLAT) > 4096:
        _FLAT.clear()
    _FLAT[id(edges)] = (edges, flat)     # holding `edges` keeps its id from being reused
    return flat
