"""Distance to completion, in tokens, for every automaton state ("complete within budget").

U[g] = fewest tokens that take state g to its rule's accepting state, using only tokens from a
budget set T (every single-byte token, plus multi-byte tokens likely to matter: BudgetTokens;
some count from some states only) and counting a
call edge g -call(q)-> r as U[start q] + U[r]. Because U is an exact shortest-path fixpoint
over real tokens, it is *achievable*: from any state with U = u there is a token leading to a
state with U = u - 1. So a mask that only allows tokens whose successor has U <= remaining - 1
can never strand the generator, and the document always completes within the budget. U is an
upper bound on the true minimum (tokens outside T, or crossing a call boundary, might do
better); with T = the whole vocabulary (small vocabularies), no recursion and no counted
string (counting.py: its formula writes one character per token) it is exact.

Computed with Dijkstra over unit token edges plus the call hyperedges (Knuth's
generalisation: a hyperedge fires once both of its inputs are final): in C (csrc/automaton.c)
when no string is counted, else with a bucket queue here, where counted strings join in.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import numpy as np

from . import background, native
from .counting import Counting
from .dfa import DEAD, Automaton
from .vocab_index import VocabIndex

INF = np.int32(2**30)
_STRUCTURAL = frozenset(b'{}[]",:-.0123456789')
# Live columns (byte classes) among those the pieces use: in a large schema a free string's
# states have nearly all columns live, a key's states one. A small schema has few columns, and
# its pieces are then walked from every state, as with no limit.
NARROW_LIVE = 32
# From this many states on, each token walk is split between two threads (the walk in C runs
# without the GIL): only the largest schemas, whose walks are long enough to repay a thread.
PARALLEL_STATES = 20_000
# Literals this long in all (bytes) make the budget set worth finding on the second thread.
BACKGROUND_LITERAL_BYTES = 5_000


@dataclass(frozen=True)
class BudgetTokens:
    """The tokens distances are computed over: `every` from every state, `narrow` (pieces of the
    schema's keys and enum values) only from states with at most NARROW_LIVE live columns. Any
    subset of real tokens keeps U achievable; a piece of a literal shortens no way out of a free
    string, and walking thousands of them from every string state was most of this pass."""
    every: list[bytes]
    narrow: list[bytes]


def budget_tokens(idx: VocabIndex, literals: set[bytes], exact_limit: int = 4096) -> BudgetTokens:
    texts, base = _vocab_budget(idx, exact_limit)
    if base is None:
        return BudgetTokens(sorted(texts), [])
    subs = {lit[i:j] for lit in literals for i in range(len(lit)) for j in range(i + 2, min(len(lit), i + 24) + 1)}
    return BudgetTokens(sorted(base), sorted((subs & texts) - base))


def budget_tokens_soon(idx: VocabIndex, literals: set[bytes]) -> Callable[[], BudgetTokens]:
    """budget_tokens, to collect later: with long literals it is found on the second thread
    meanwhile (the caller's C passes leave the GIL free)."""
    if sum(map(len, literals)) >= BACKGROUND_LITERAL_BYTES:
        return background.submit(budget_tokens, idx, literals).result
    return functools.partial(budget_tokens, idx, literals)


def _vocab_budget(idx: VocabIndex, exact_limit: int) -> tuple[frozenset[bytes], frozenset[bytes] | None]:
    """(every allowed token text, the schema-independent part of the budget set or None when the
    whole vocabulary is used); computed once per vocabulary: it walks every token."""
    def build() -> tuple[frozenset[bytes], frozenset[bytes] | None]:
        texts = frozenset(idx.token_bytes[i] for i in np.flatnonzero(~idx.excluded))
        base = None
        if len(texts) > exact_limit:
            base = frozenset(t for t in texts if len(t) == 1 or (len(t) <= 8 and _STRUCTURAL.issuperset(t)))
        return texts, base
    return idx.derived(("budget", exact_limit), build)


def _token_edges(aut: Automaton, toks: list[bytes], counted: np.ndarray | None = None,
                 max_start_live: int = -1) -> tuple[np.ndarray, np.ndarray]:
    """Unique (src, dst) state pairs with some token in `toks` leading src -> dst (bytes only),
    src with at most `max_start_live` live columns among the tokens' (< 0: any). With `counted`
    (states of length-bounded strings), paths that start in or pass through one are left out:
    only a counted state's entry (its count then 0) may end a path."""
    n = aut.n_states
    if n <= 1 or not toks:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    # Spelled in the table's columns (byte classes): tokens that differ only in bytes of one
    # class take the same paths, and are walked once.
    toks = list({t.translate(aut.byte_class) for t in toks})
    counted = counted if counted is not None else np.zeros(n, dtype=bool)
    walk = functools.partial(native.token_edges, aut.trans, counted, _trie(toks), max_start_live)
    if n < PARALLEL_STATES:
        return walk()
    odd = background.submit(walk, 1, 2)
    src, dst = walk(2, 2)
    src_odd, dst_odd = odd.result()
    return np.concatenate([src, src_odd]), np.concatenate([dst, dst_odd])


def _budget_edges(aut: Automaton, budget: BudgetTokens, counted: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    src, dst = _token_edges(aut, budget.every, counted)
    src2, dst2 = _token_edges(aut, budget.narrow, counted, NARROW_LIVE)
    return np.concatenate([src, src2]), np.concatenate([dst, dst2])


def _trie(toks: list[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The tokens as a trie in CSR form: (child offsets per node, child bytes, child nodes,
    node is a token); node 0 is the root."""
    node_of = {b"": 0}
    for t in sorted(set(toks)):        # sorted: a prefix is numbered before its extensions
        for i in range(1, len(t) + 1):
            node_of.setdefault(t[:i], len(node_of))
    parent = np.zeros(len(node_of), dtype=np.int64)
    byte = np.zeros(len(node_of), dtype=np.uint8)
    for w, k in node_of.items():
        if k:
            parent[k] = node_of[w[:-1]]
            byte[k] = w[-1]
    is_token = np.zeros(len(node_of), dtype=np.uint8)
    is_token[[node_of[t] for t in toks]] = 1
    children = np.argsort(parent[1:], kind="stable") + 1
    offsets = np.searchsorted(parent[children], np.arange(len(node_of) + 1))
    return offsets, byte[children], children, is_token


def token_distances(aut: Automaton, budget: BudgetTokens, counting: Counting | None = None) -> np.ndarray:
    """U per state; a counted state's U is for a count of 0 (its formula: counting.py), set once
    the state after its closing quote has its own."""
    n = aut.n_states
    counts = counting is not None and counting.any
    src, dst = _budget_edges(aut, budget, counting.counted if counts else None)
    by_exit: dict[int, np.ndarray] = {}
    if counts:
        cs = np.flatnonzero(counting.counted & (counting.exit != DEAD))
        for q in np.unique(counting.exit[cs]):
            by_exit[int(q)] = cs[counting.exit[cs] == q]
    order = np.argsort(dst, kind="stable")
    src = src[order]
    start = np.searchsorted(dst[order], np.arange(n + 1))
    if not by_exit:
        e = aut.call_edges
        g_a_b = (e[:, 0], np.asarray(aut.rule_start, dtype=np.int64)[e[:, 1]], e[:, 2])
        return native.shortest_distances(n, start, src, aut.accept, g_a_b, int(INF))
    hyper: dict[int, list[tuple[int, int, int]]] = {}
    for g, cs in enumerate(aut.calls):
        for q, ret in cs:
            e = (g, aut.rule_start[q], ret)
            hyper.setdefault(e[1], []).append(e)
            hyper.setdefault(ret, []).append(e)
    in_hyper = np.zeros(n, dtype=bool)
    in_hyper[list(hyper)] = True
    U = np.full(n, INF, dtype=np.int32)
    buckets: dict[int, list[np.ndarray]] = {0: [np.flatnonzero(aut.accept)]}
    while buckets:
        k = min(buckets)
        cand = np.unique(np.concatenate(buckets.pop(k)))
        new = cand[U[cand] == INF]
        new = new[new != DEAD]
        if new.size == 0:
            continue
        U[new] = k
        preds = np.concatenate([src[start[x]:start[x + 1]] for x in new]) if new.size < 32 else \
            src[_ranges(start[new], start[new + 1])]
        preds = preds[U[preds] == INF]
        if preds.size:
            buckets.setdefault(k + 1, []).append(preds)
        for x in new[in_hyper[new]]:
            for g, a, b in hyper[int(x)]:
                if U[g] == INF and U[a] < INF and U[b] < INF:
                    buckets.setdefault(int(U[a] + U[b]), []).append(np.array([g]))
        if by_exit:
            for x in new:
                strings = by_exit.get(int(x))
                if strings is not None:
                    vals = counting.u_many(strings, np.zeros(strings.size, dtype=np.int64), U)
                    for v in np.unique(vals[vals < INF]):
                        buckets.setdefault(int(v), []).append(strings[vals == v])
    return U


def _ranges(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    lens = hi - lo
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    return np.repeat(lo - np.concatenate([[0], np.cumsum(lens)[:-1]]), lens) + np.arange(total)
