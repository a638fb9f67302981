"""Products of two leaf automata: the byte strings both match, or one matches and the other not."""
from __future__ import annotations

from . import ir
from .thompson import leaf_dfa


def intersection(a, b, max_states: int = 20_000) -> ir.Table | None:
    """A DFA for the byte strings both IRs (no calls, no objects) match: their leaf automata
    run side by side from the start; None past `max_states` reachable pairs."""
    return _product(a, b, max_states, minus=False)


def difference(a, b, max_states: int = 20_000) -> ir.Table | None:
    """A DFA for the byte strings `a` matches and `b` does not (None as for intersection)."""
    return _product(a, b, max_states, minus=True)


def _product(a, b, max_states: int, minus: bool) -> ir.Table | None:
    # With `minus`, bytes b has no edge for lead to b's sink (-1), where a alone decides.
    edges_a, accept_a = leaf_dfa(a)
    edges_b, accept_b = leaf_dfa(b)
    ids = {(0, 0): 0}
    order = [(0, 0)]
    out: list[tuple] = []
    i = 0
    while i < len(order):
        x, y = order[i]
        by_target: dict[int, int] = {}

        def add(mask: int, pair: tuple[int, int]) -> None:
            target = ids.setdefault(pair, len(order))
            if target == len(order):
                order.append(pair)
            by_target[target] = by_target.get(target, 0) | mask

        for mask_a, ta in edges_a[x]:
            unmatched = mask_a
            for mask_b, tb in edges_b[y] if y >= 0 else ():
                both = mask_a & mask_b
                if both:
                    add(both, (ta, tb))
                    unmatched &= ~mask_b
            if minus and unmatched:
                add(unmatched, (ta, -1))
        if len(order) > max_states:
            return None
        out.append(tuple((m, t) for t, m in sorted(by_target.items())))
        i += 1
    in_b = [y >= 0 and accept_b[y] for _, y in order]
    return ir.Table(tuple(out), tuple(accept_a[x] and (not in_b[k] if minus else in_b[k])
                                      for k, (x, _) in enumerate(order)))
