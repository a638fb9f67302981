"""NFA -> one global table of per-rule DFAs (subset construction, trimming, minimisation).

Every rule (the root, plus one per recursive $ref target) becomes a DFA over bytes whose
states may also carry call edges `call(q) -> return state`. All rules' states share one
numbering; state 0 is the dead state (every byte loops to it).
"""
from __future__ import annotations

from dataclasses import dataclass
import numpy as np

from . import native
from .errors import SchemaError
from .nfa import NFA

DEAD = 0
# Minimisation (partition refinement, O(m log n)) merges few of the largest schemas' states, and
# costs them more time than it saves the passes after it: above this many states it is skipped,
# and the automaton stays as subset construction made it (trimmed). Same language either way.
MINIMIZE_MAX_STATES = 50_000


class EmptyLanguage(SchemaError):
    """The root rule matches no string at all."""

    def __init__(self) -> None:
        super().__init__("no JSON document satisfies this schema")


class CountConflict(Exception):
    """One automaton state would need two different string counters (alternatives holding
    length-bounded strings at the same position): the caller unrolls the counts instead."""


@dataclass
class Automaton:
    trans: np.ndarray            # int32 [n_states, n_classes]: column byte_class[b] for byte b
    accept: np.ndarray           # bool [n_states]: the state's rule may end here
    calls: list[tuple[tuple[int, int], ...]]  # per state: (rule, return state) pairs
    rule_start: list[int]
    rule_of: np.ndarray          # int32 [n_states]
    count_tag: np.ndarray        # int32 [n_states]: 0, or 1 + index into count_tags (counted string states)
    count_tags: list[tuple[int, int | None, bool]]   # (lo, hi, at a character boundary)
    call_edges: np.ndarray       # int [k, 3]: `calls` as (state, rule, return state) rows, sorted
    # Each byte's class (bytes no edge tells apart: every state's transitions on them are the
    # same), as a bytes.translate table. A table over classes is a third of one over bytes.
    byte_class: bytes = bytes(range(256))

    @property
    def n_states(self) -> int:
        return self.trans.shape[0]

    def row(self, g: int) -> np.ndarray:
        """State g's transitions over all 256 bytes."""
        return self.trans[g][np.frombuffer(self.byte_class, dtype=np.uint8)]


@dataclass(frozen=True)
class SubsetInput:
    """An NFA as the C subset construction takes it (arrays grouped by source state)."""
    eps: tuple[np.ndarray, ...]
    edges: tuple[np.ndarray, ...]
    mask_classes: np.ndarray
    calls: tuple[np.ndarray, ...]
    tags: np.ndarray
    tag_ids: dict[tuple, int]
    classes: np.ndarray
    rules: list[tuple[int, int]]


def prepare(nfa: NFA, rules: list[tuple[int, int]]) -> SubsetInput:
    masks, mask_bits = _masks(nfa)
    classes, class_rep = _byte_classes(mask_bits)
    mask_id = {m: i for i, m in enumerate(masks)}
    tag_ids: dict[tuple, int] = {}
    tags = np.zeros(nfa.n, dtype=np.int32)
    for s, tag in nfa.counted.items():
        tags[s] = tag_ids.setdefault(tag, len(tag_ids) + 1)
    return SubsetInput(
        eps=_csr(nfa.n, nfa.eps_src, nfa.eps_dst),
        edges=_csr(nfa.n, nfa.edge_src, list(map(mask_id.__getitem__, nfa.edge_mask)), nfa.edge_dst),
        mask_classes=mask_bits[:, class_rep],
        calls=_csr(nfa.n, nfa.call_src, nfa.call_rule, nfa.call_dst),
        tags=tags, tag_ids=tag_ids, classes=classes, rules=rules)


def build(nfa: NFA, rules: list[tuple[int, int]], max_states: int = 200_000, minimal: bool = False) -> Automaton:
    """From an NFA and its rules' (start, end) states.
    minimal: minimise whatever the size (for callers that rely on a minimal automaton)."""
    return build_prepared(prepare(nfa, rules), max_states, minimal)


def build_prepared(given: SubsetInput, max_states: int = 200_000, minimal: bool = False) -> Automaton:
    """build() from prepare()'s result: a caller may start work on another thread in between,
    once the GIL-bound preparation is done (subset construction, in C, holds no GIL)."""
    try:
        sub = native.subset_construct(eps=given.eps, edges=given.edges, mask_classes=given.mask_classes,
                                      calls=given.calls, tags=given.tags, rules=given.rules, max_states=max_states)
    except native.CountConflictError:
        raise CountConflict() from None
    tag_ids, classes = given.tag_ids, given.classes
    table, accept, calls, starts, live = _trim(sub.trans, sub.accept, sub.calls, sub.starts)
    if minimal or table.shape[0] <= MINIMIZE_MAX_STATES:
        block, count = _minimal_blocks(table, accept, calls, starts, sub.rule_of, sub.count_tag, live)
    else:
        block, count = _live_blocks(live)
    table, accept, calls, starts, rule_of, tags = _quotient(table, accept, calls, starts, sub.rule_of,
                                                            sub.count_tag, block, count)
    calls = calls[np.lexsort(calls.T[::-1])] if len(calls) else calls.reshape(0, 3)
    return Automaton(
        trans=table,
        accept=accept,
        calls=calls_by_state(calls, table.shape[0]),
        rule_start=starts,
        rule_of=rule_of,
        count_tag=tags,
        count_tags=sorted(tag_ids, key=tag_ids.get),
        call_edges=calls,
        byte_class=bytes(classes.astype(np.uint8).tolist()),
    )


def calls_by_state(edges: np.ndarray, n: int) -> list[tuple[tuple[int, int], ...]]:
    """Per state, its (rule, return state) pairs, from call edges [k, 3] of (state, rule,
    return state) in their order."""
    per_state: list[tuple[tuple[int, int], ...]] = [()] * n
    for g, q, ret in edges.tolist():
        per_state[g] += ((q, ret),)
    return per_state


def _csr(n: int, src: list[int], *columns: list[int]) -> tuple[np.ndarray, ...]:
    """Edges given as parallel lists, grouped by source: (offsets [n + 1], *columns in that order)."""
    src_arr = np.asarray(src, dtype=np.int64)
    order = np.argsort(src_arr, kind="stable")
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(src_arr, minlength=n), out=offsets[1:])
    return (offsets, *(np.asarray(c, dtype=np.int64)[order] for c in columns))


def _masks(nfa: NFA) -> tuple[list[int], np.ndarray]:
    """The distinct edge labels, and their bytes as a bool matrix [labels, 256]."""
    masks = list(set(nfa.edge_mask))
    raw = np.frombuffer(b"".join(m.to_bytes(32, "little") for m in masks), dtype=np.uint8).reshape(len(masks), 32)
    return masks, np.unpackbits(raw, axis=1, bitorder="little")


def _byte_classes(bits: np.ndarray) -> tuple[np.ndarray, list[int]]:
    """Partition bytes into classes no edge label (rows of `bits`: [labels, 256]) distinguishes
    (alphabet compression)."""
    if not bits.shape[0]:
        return np.zeros(256, dtype=np.int64), [0]
    _, first, cls = np.unique(bits.T, axis=0, return_index=True, return_inverse=True)
    # Number classes in order of their first byte, as before (class of byte 0 is 0).
    order = np.argsort(first)
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    cls = rank[cls.ravel()]
    return cls.astype(np.int64), sorted(first.tolist())


def _trim(table, accept, calls, starts):
    """Remove states from which no accepting state is reachable; drop calls to rules that
    cannot produce any string. `calls`: int [k, 3] of (state, rule, return state). Raises
    EmptyLanguage if the root rule becomes empty. Also returns which states are live."""
    live, productive = native.live_states(table, accept, calls, starts)
    if not productive[0]:
        raise EmptyLanguage()
    if not live[1:].all():       # usually all are: skip a pass over the table
        table = np.where(live[table], table, DEAD).astype(np.int32)
        table[~live] = DEAD
    calls = calls[live[calls[:, 0]] & productive[calls[:, 1]] & live[calls[:, 2]]]
    starts = [int(s) if productive[r] else DEAD for r, s in enumerate(starts)]
    return table, accept & live, calls, starts, live


def _minimal_blocks(table, accept, calls, starts, rule_of, tags, live) -> tuple[np.ndarray, int]:
    """States with the same future share a block (Hopcroft's partition refinement, in C); call
    edges are labelled by their rule; states of different rules, acceptance or counter tags never
    merge. Block 0 is DEAD's, and the states trimming left without a future join it."""
    key = (rule_of.astype(np.int64) + 1) << 33 | tags.astype(np.int64) << 1 | accept
    key[~live] = -1
    key[DEAD] = -1
    _, first_block = np.unique(key, return_inverse=True)
    block, count = native.minimize(table, calls[:, 0], calls[:, 1], calls[:, 2], len(starts), first_block.ravel())
    order = np.arange(count)
    order[[0, block[DEAD]]] = order[[block[DEAD], 0]]
    return order[block], count


def _live_blocks(live: np.ndarray) -> tuple[np.ndarray, int]:
    """Each live state its own block, numbered in order; the dead ones join DEAD's block 0."""
    live = live.copy()
    live[DEAD] = False
    block = np.cumsum(live) * live
    return block.astype(np.int64), int(live.sum()) + 1


def _quotient(table, accept, calls, starts, rule_of, tags, block: np.ndarray, count: int):
    """The automaton over blocks (every state of a block has the same transitions, in blocks)."""
    n = table.shape[0]
    if count == n and (block == np.arange(n)).all():      # nothing to merge or renumber
        return table, accept, calls, starts, rule_of, tags
    rep = np.zeros(count, dtype=np.int64)
    rep[block[::-1]] = np.arange(n)[::-1]      # first state of each block
    is_rep = np.zeros(n, dtype=bool)
    is_rep[rep] = True
    kept = calls[is_rep[calls[:, 0]]]
    new_calls = np.stack([block[kept[:, 0]], kept[:, 1], block[kept[:, 2]]], axis=1)
    return native.quotient_table(table, rep, block), accept[rep], new_calls, [int(block[s]) for s in starts], \
        rule_of[rep], tags[rep]
