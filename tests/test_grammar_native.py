"""The C automaton loops (sampling/grammar/csrc) against brute force on random small automata.
The grammar tests exercise them end to end; these pin the two whose mistakes would be silent
(a state merged with one of another language, a live state trimmed)."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sampling.grammar import native


@st.composite
def partial_dfas(draw):
    """(table [n, classes] with 0 = no edge and row 0 the dead state, accept [n])."""
    n = draw(st.integers(2, 10))
    n_cls = draw(st.integers(1, 3))
    cells = draw(st.lists(st.integers(0, n - 1), min_size=n * n_cls, max_size=n * n_cls))
    table = np.array(cells, dtype=np.int32).reshape(n, n_cls)
    table[0] = 0
    accept = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    accept[0] = False
    return table, accept


def same_language(table, accept, p: int, q: int) -> bool:
    seen, todo = {(p, q)}, [(p, q)]
    while todo:
        a, b = todo.pop()
        if accept[a] != accept[b]:
            return False
        for c in range(table.shape[1]):
            nxt = (int(table[a, c]), int(table[b, c]))
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return True


@settings(max_examples=300, deadline=None)
@given(partial_dfas())
def test_minimize_merges_exactly_the_states_of_one_language(dfa):
    table, accept = dfa
    live, _ = native.live_states(table, accept, np.zeros((0, 3), dtype=np.int32), [1])
    table = np.where(live[table], table, 0).astype(np.int32)    # trimmed first, as dfa.py does
    table[~live] = 0
    first = np.where(np.arange(len(accept)) == 0, 2, accept.astype(np.int64))
    block, count = native.minimize(table, [], [], [], 0, first)
    assert count == len(set(block.tolist()))
    for p in range(1, len(accept)):
        for q in range(p + 1, len(accept)):
            assert (block[p] == block[q]) == same_language(table, accept, p, q), (p, q)


@settings(max_examples=300, deadline=None)
@given(partial_dfas(), st.data())
def test_live_states_are_the_least_fixpoint_with_calls(dfa, data):
    table, accept = dfa
    n = len(accept)
    starts = data.draw(st.lists(st.integers(1, n - 1), min_size=1, max_size=3))
    calls = np.array(data.draw(st.lists(st.tuples(st.integers(1, n - 1), st.integers(0, len(starts) - 1),
                                                  st.integers(1, n - 1)), max_size=6)), dtype=np.int32).reshape(-1, 3)
    live, productive = native.live_states(table, accept, calls, starts)
    want = accept.copy()
    while True:        # brute force: apply the rules until nothing changes
        rules_ok = [bool(want[s]) for s in starts]
        now = want.copy()
        for s in range(1, n):
            now[s] |= any(want[t] for t in table[s].tolist() if t)
            now[s] |= any(rules_ok[r] and want[d] for g, r, d in calls.tolist() if g == s)
        if (now == want).all():
            break
        want = now
    assert live.tolist() == want.tolist()
    assert productive.tolist() == [bool(want[s]) for s in starts]


def test_ir_nodes_keep_their_hash_but_not_across_pickling():
    import pickle

    from sampling.grammar import ir

    node = ir.alt(ir.lit(b'"a"'), ir.Leaf(ir.lit(b'"bc"')))
    h = hash(node)
    assert node._hash == h and hash(node) == h
    copy = pickle.loads(pickle.dumps(node))
    assert not hasattr(copy, "_hash") and copy == node and hash(copy) == h


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 40), st.data())
def test_shortest_distances_are_the_least_fixpoint_with_calls(n, data):
    edges = data.draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=4 * n))
    calls = data.draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1), st.integers(0, n - 1)),
                               max_size=n))
    accept = np.array([x > 0 and data.draw(st.booleans()) for x in range(n)])
    inf = 2**30
    expect = [0 if accept[x] else inf for x in range(n)]
    changed = True
    while changed:              # relax to the fixpoint; state 0 (dead) stays out
        changed = False
        for p, x in edges:
            if p and expect[x] + 1 < expect[p]:
                expect[p], changed = expect[x] + 1, True
        for g, a, b in calls:
            if g and expect[a] < inf and expect[b] < inf and expect[a] + expect[b] < expect[g]:
                expect[g], changed = expect[a] + expect[b], True
    src = np.array([p for p, _ in edges], dtype=np.int64)
    dst = np.array([x for _, x in edges], dtype=np.int64)
    order = np.argsort(dst, kind="stable")
    start = np.searchsorted(dst[order], np.arange(n + 1))
    hyper = tuple(np.array([c[i] for c in calls], dtype=np.int32) for i in range(3))
    U = native.shortest_distances(n, start, src[order], accept, hyper, inf)
    assert U.tolist() == expect
