"""NFA -> one global table of per-rule DFAs (subset construction, trimming, minimisation).

Every rule (the root, plus one per recursive $ref target) becomes a DFA over bytes whose
states may also carry call edges `call(q) -> return state`. All rules' states share one
numbering; state 0 is the dead state (every byte loops to it).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import SchemaError
from .nfa import NFA

DEAD = 0


class CountConflict(Exception):
    """One automaton state would need two different string counters (alternatives holding
    length-bounded strings at the same position): the caller unrolls the counts instead."""


@dataclass
class Automaton:
    trans: np.ndarray            # int32 [n_states, 256]
    accept: np.ndarray           # bool [n_states]: the state's rule may end here
    calls: list[tuple[tuple[int, int], ...]]  # per state: (rule, return state) pairs
    rule_start: list[int]
    rule_of: np.ndarray          # int32 [n_states]
    count_tag: np.ndarray        # int32 [n_states]: 0, or 1 + index into count_tags (counted string states)
    count_tags: list[tuple[int, int | None, bool]]   # (lo, hi, at a character boundary)

    @property
    def n_states(self) -> int:
        return self.trans.shape[0]


def build(nfa: NFA, rules: list[tuple[int, int]], max_states: int = 200_000) -> Automaton:
    classes, class_rep = _byte_classes(nfa)
    n_cls = len(class_rep)
    mask_classes: dict[int, int] = {}
    all_classes = (1 << n_cls) - 1
    closure_memo: dict[int, frozenset[int]] = {}

    def closure(states) -> frozenset[int]:
        out: set[int] = set()
        for s0 in states:
            c = closure_memo.get(s0)
            if c is None:
                seen, todo = {s0}, [s0]
                while todo:
                    for t in nfa.eps[todo.pop()]:
                        if t not in seen:
                            seen.add(t)
                            todo.append(t)
                c = closure_memo[s0] = frozenset(seen)
            out |= c
        return frozenset(out)

    ids: dict[tuple[int, frozenset[int]], int] = {}
    rows: list[list[int]] = [[DEAD] * n_cls]       # plain lists: a numpy call per edge costs more
    class_index: dict[int, list[int]] = {}
    accept: list[bool] = [False]
    rule_of: list[int] = [-1]
    calls_raw: list[dict[int, int]] = [{}]
    sets: list[frozenset[int]] = [frozenset()]
    count_tag: list[int] = [0]
    tag_ids: dict[tuple, int] = {}
    counted = nfa.counted

    def tag_of(st: frozenset[int]) -> int:
        found = {counted[x] for x in st if x in counted} if counted else ()
        if not found:
            return 0
        if len(found) > 1:
            raise CountConflict()
        (tag,) = found
        return tag_ids.setdefault(tag, len(tag_ids) + 1)

    starts = []
    for r, (s, e) in enumerate(rules):
        todo = []

        def intern(st: frozenset[int]) -> int:
            if not st:
                return DEAD
            key = (r, st)
            g = ids.get(key)
            if g is None:
                g = ids[key] = len(rows)
                if g > max_states:
                    raise SchemaError(f"schema too large: more than {max_states} automaton states")
                rows.append([DEAD] * n_cls)
                accept.append(e in st)
                rule_of.append(r)
                calls_raw.append({})
                sets.append(st)
                count_tag.append(tag_of(st))
                todo.append(g)
            return g

        starts.append(intern(closure([s])))
        while todo:
            g = todo.pop()
            # Partition the byte classes by the set of NFA targets they lead to (class sets as
            # int bitmasks), so that each distinct target set is closed and interned once.
            # Edges with the same label are split on once (a set can hold hundreds of them).
            by_mask: dict[int, list[int]] = {}
            cmoves: dict[int, set[int]] = {}
            for ns in sets[g]:
                for mask, t in nfa.edges[ns]:
                    by_mask.setdefault(mask, []).append(t)
                for q, t in nfa.calls[ns]:
                    cmoves.setdefault(q, set()).add(t)
            parts: list[tuple[int, tuple[int, ...]]] = [(all_classes, ())]
            for mask, targets in by_mask.items():
                cm = mask_classes.get(mask)
                if cm is None:
                    cm = mask_classes[mask] = sum(1 << c for c in range(n_cls) if mask >> class_rep[c] & 1)
                split = []
                for pm, ts in parts:
                    inside = pm & cm
                    if inside:
                        split.append((inside, ts + tuple(targets)))
                        if pm != inside:
                            split.append((pm ^ inside, ts))
                    else:
                        split.append((pm, ts))
                parts = split
            row = rows[g]
            for pm, ts in parts:
                if not ts:
                    continue
                target = intern(closure(ts))
                cols = class_index.get(pm)
                if cols is None:
                    cols = class_index[pm] = [c for c in range(n_cls) if pm >> c & 1]
                for c in cols:
                    row[c] = target
            calls_raw[g] = {q: intern(closure(ts)) for q, ts in cmoves.items()}
    table = np.array(rows, dtype=np.int32)
    aut = _trim(table, np.array(accept), calls_raw, starts, np.array(rule_of, dtype=np.int32))
    tags = np.array(count_tag, dtype=np.int32)
    table, acc, calls_raw, starts, rule_of, tags = _minimize(*aut, tags)
    return Automaton(
        trans=np.ascontiguousarray(table[:, classes]),
        accept=acc,
        calls=[tuple(sorted(c.items())) for c in calls_raw],
        rule_start=starts,
        rule_of=rule_of,
        count_tag=tags,
        count_tags=sorted(tag_ids, key=tag_ids.get),
    )


def _byte_classes(nfa: NFA) -> tuple[np.ndarray, list[int]]:
    """Partition bytes into classes no edge label distinguishes (alphabet compression)."""
    masks = list({m for es in nfa.edges for m, _ in es})
    if not masks:
        return np.zeros(256, dtype=np.int64), [0]
    raw = np.frombuffer(b"".join(m.to_bytes(32, "little") for m in masks), dtype=np.uint8).reshape(len(masks), 32)
    bits = np.unpackbits(raw, axis=1, bitorder="little")          # [masks, 256]: byte b in mask
    _, first, cls = np.unique(bits.T, axis=0, return_index=True, return_inverse=True)
    # Number classes in order of their first byte, as before (class of byte 0 is 0).
    order = np.argsort(first)
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    cls = rank[cls.ravel()]
    return cls.astype(np.int64), sorted(first.tolist())


def _trim(table, accept, calls, starts, rule_of):
    """Remove states from which no accepting state is reachable; drop calls to rules that
    cannot produce any string. Raises SchemaError if the root rule becomes empty."""
    n = table.shape[0]
    productive = [False] * len(starts)
    while True:
        extra = [(g, ret) for g in range(n) for q, ret in calls[g].items() if productive[q]]
        live = _coreachable(table, accept, extra)
        now = [bool(live[s]) for s in starts]
        if now == productive:
            break
        productive = now
    if not productive[0]:
        raise SchemaError("no JSON document satisfies this schema")
    table = np.where(live[table], table, DEAD).astype(np.int32)
    calls = [
        {q: ret for q, ret in c.items() if productive[q] and live[ret]} if live[g] else {}
        for g, c in enumerate(calls)
    ]
    table[~live] = DEAD
    starts = [s if productive[r] else DEAD for r, s in enumerate(starts)]
    return table, accept & live, calls, starts, rule_of


def _coreachable(table: np.ndarray, accept: np.ndarray, extra: list[tuple[int, int]]) -> np.ndarray:
    """States from which an accepting state is reachable (reverse BFS over a CSR graph)."""
    n, c = table.shape
    src = np.concatenate([np.repeat(np.arange(n), c), np.array([a for a, _ in extra], dtype=np.int64)])
    dst = np.concatenate([table.ravel().astype(np.int64), np.array([b for _, b in extra], dtype=np.int64)])
    keep = (dst != DEAD) & (src != DEAD)
    src, dst = src[keep], dst[keep]
    order = np.argsort(dst, kind="stable")
    src = src[order]
    starts = np.searchsorted(dst[order], np.arange(n + 1))
    live = accept.copy()
    live[DEAD] = False
    frontier = np.flatnonzero(live)
    while frontier.size:
        preds = np.concatenate([src[starts[f]:starts[f + 1]] for f in frontier]) if frontier.size < 64 \
            else src[_ranges(starts[frontier], starts[frontier + 1])]
        preds = np.unique(preds)
        preds = preds[~live[preds]]
        live[preds] = True
        frontier = preds
    return live


def _ranges(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Concatenation of arange(lo[i], hi[i]) for all i, vectorised."""
    lens = hi - lo
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    offs = np.repeat(lo - np.concatenate([[0], np.cumsum(lens)[:-1]]), lens)
    return offs + np.arange(total)


def _minimize(table, accept, calls, starts, rule_of, tags, max_rounds: int = 400):
    """Moore partition refinement; call edges are extra columns (one per rule); states with
    different counter tags are never merged. If it does not converge within `max_rounds`
    (very long chains), the unminimised automaton is kept: any partial refinement would be
    unsound."""
    n, n_rules = table.shape[0], len(starts)
    callcols = np.zeros((n, n_rules), dtype=np.int32)
    for g, c in enumerate(calls):
        for q, ret in c.items():
            callcols[g, q] = ret
    full = np.concatenate([table, callcols], axis=1)
    key = np.stack([rule_of, accept.astype(np.int32), tags], axis=1)
    key[DEAD] = (-2, 0, 0)
    _, block = np.unique(key, axis=0, return_inverse=True)
    block = block.ravel()
    count = block.max() + 1
    # Rows are compared through a random 64-bit linear hash (1-D unique is far faster than
    # row-wise unique); the result is verified below, so a collision can only cost the
    # minimisation, never correctness.
    weights = np.random.default_rng(12345).integers(1, 2**63, size=full.shape[1] + 1, dtype=np.uint64) | np.uint64(1)
    # Only live edges enter the hash (most entries of the table are DEAD): a live target adds
    # (its block + 1) * the column's weight, a DEAD one nothing.
    src, col = np.nonzero(full != DEAD)
    dst = full[src, col]
    col_w = weights[1:][col]
    has_edges = np.flatnonzero(np.diff(src, prepend=-1))    # first edge of each source
    with_edges = src[has_edges]
    for _ in range(max_rounds):
        with np.errstate(over="ignore"):
            h = block.astype(np.uint64) * weights[0]
            if src.size:
                h[with_edges] += np.add.reduceat((block[dst].astype(np.uint64) + np.uint64(1)) * col_w, has_edges)
        _, nb = np.unique(h, return_inverse=True)
        nb = nb.ravel()
        if nb.max() + 1 == count:
            break
        block, count = nb, nb.max() + 1
    else:
        return table, accept, calls, starts, rule_of, tags
    rep0 = np.zeros(count, dtype=np.int64)
    rep0[block[::-1]] = np.arange(n)[::-1]
    if not (block[full] == block[full[rep0[block]]]).all():
        return table, accept, calls, starts, rule_of, tags
    # Renumber so that DEAD's block is 0.
    order = np.arange(count)
    order[[0, block[DEAD]]] = order[[block[DEAD], 0]]
    block = order[block]
    rep = np.zeros(count, dtype=np.int64)
    rep[block[::-1]] = np.arange(n)[::-1]      # first state of each block
    new_table = block[table[rep]].astype(np.int32)
    new_calls = [{q: int(block[ret]) for q, ret in calls[r].items()} for r in rep]
    return new_table, accept[rep], new_calls, [int(block[s]) for s in starts], rule_of[rep], tags[rep]
