"""An NFA with byte-set edges, epsilon edges and call edges (thompson.py builds one from IR,
dfa.py determinises it)."""
from __future__ import annotations

Frag = tuple[int, int]  # (start state, end state)


class NFA:
    """States are numbers; edges are kept as parallel lists (dfa.py turns them into arrays)."""

    def __init__(self) -> None:
        self.n = 0
        self.eps_src: list[int] = []
        self.eps_dst: list[int] = []
        self.edge_src: list[int] = []
        self.edge_mask: list[int] = []      # byte set, as a 256-bit int
        self.edge_dst: list[int] = []
        self.call_src: list[int] = []
        self.call_rule: list[int] = []
        self.call_dst: list[int] = []       # the return state
        self.counted: dict[int, tuple[int, int | None, bool]] = {}   # state -> (lo, hi, at a character boundary)

    def new(self) -> int:
        self.n += 1
        return self.n - 1

    def link(self, a: int, b: int) -> None:
        """An epsilon edge."""
        self.eps_src.append(a)
        self.eps_dst.append(b)

    def byte_edge(self, a: int, mask: int, b: int) -> None:
        self.edge_src.append(a)
        self.edge_mask.append(mask)
        self.edge_dst.append(b)

    def call_edge(self, a: int, rule: int, b: int) -> None:
        self.call_src.append(a)
        self.call_rule.append(rule)
        self.call_dst.append(b)
