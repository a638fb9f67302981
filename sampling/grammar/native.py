"""numpy arrays in, numpy arrays out: the C loops of csrc/automaton.c (subset construction,
live states, minimisation, token edges), built at install time by cffi as the module
`_cobatch_automaton`."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from _cobatch_automaton import ffi, lib

from .errors import SchemaError


class CountConflictError(Exception):
    """Two different counter tags met in one automaton state (dfa.CountConflict's cause)."""


@dataclass
class Subsets:
    trans: np.ndarray        # int32 [states, classes]
    accept: np.ndarray       # bool [states]
    rule_of: np.ndarray      # int32 [states]
    count_tag: np.ndarray    # int32 [states]
    calls: np.ndarray        # int32 [calls, 3]: state, rule, return state
    starts: list[int]


def _i32(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.int32)


def _ptr(a: np.ndarray, ctype: str = "int32_t *"):
    """A C pointer into `a`'s memory (contiguous; `a` must outlive the call)."""
    return ffi.from_buffer(ctype.replace(" *", "[]"), a)


def _copy(ptr, count: int, dtype) -> np.ndarray:
    if count == 0:
        return np.zeros(0, dtype=dtype)
    return np.frombuffer(ffi.buffer(ptr, count * np.dtype(dtype).itemsize), dtype=dtype).copy()


def subset_construct(eps: tuple[np.ndarray, np.ndarray], edges: tuple[np.ndarray, np.ndarray, np.ndarray],
                     mask_classes: np.ndarray, calls: tuple[np.ndarray, np.ndarray, np.ndarray],
                     tags: np.ndarray, rules: list[tuple[int, int]], max_states: int) -> Subsets:
    """eps = (offsets, targets), edges = (offsets, mask ids, targets), calls = (offsets, rules,
    targets): CSR over NFA states. mask_classes: uint8 [masks, classes]."""
    eps_off, eps_dst = map(_i32, eps)
    edge_off, edge_mask, edge_dst = map(_i32, edges)
    call_off, call_rule, call_dst = map(_i32, calls)
    mask_cls = np.ascontiguousarray(mask_classes, dtype=np.uint8)
    tags = _i32(tags)
    rule_start, rule_end = _i32([s for s, _ in rules]), _i32([e for _, e in rules])
    n_cls = mask_cls.shape[1]
    out = ffi.new("subset_result *")
    status = lib.subset_construct(
        len(eps_off) - 1, _ptr(eps_off), _ptr(eps_dst), _ptr(edge_off), _ptr(edge_mask), _ptr(edge_dst),
        mask_cls.shape[0], n_cls, _ptr(mask_cls, "uint8_t *"), _ptr(call_off), _ptr(call_rule), _ptr(call_dst),
        _ptr(tags), len(rules), _ptr(rule_start), _ptr(rule_end), max_states, out)
    if status == lib.AUTOMATON_TOO_LARGE:
        raise SchemaError(f"schema too large: more than {max_states} automaton states")
    if status == lib.AUTOMATON_COUNT_CONFLICT:
        raise CountConflictError()
    if status != lib.AUTOMATON_OK:
        raise MemoryError("automaton construction ran out of memory")
    try:
        n = out.n_states
        # The table (large for a large schema) is handed over, not copied: numpy's array keeps
        # the buffer, which frees it with the array.
        owned = ffi.gc(out.trans, lib.automaton_free)
        out.trans = ffi.NULL
        return Subsets(
            trans=np.frombuffer(ffi.buffer(owned, n * n_cls * 4), dtype=np.int32).reshape(n, n_cls),
            accept=_copy(out.accept, n, np.uint8).astype(bool),
            rule_of=_copy(out.rule_of, n, np.int32),
            count_tag=_copy(out.count_tag, n, np.int32),
            calls=_copy(out.calls, 3 * out.n_calls, np.int32).reshape(out.n_calls, 3),
            starts=[int(x) for x in ffi.unpack(out.starts, len(rules))],
        )
    finally:
        lib.subset_free(out)


def live_states(table: np.ndarray, accept: np.ndarray, calls: np.ndarray, starts) -> tuple[np.ndarray, np.ndarray]:
    """(live per state, productive per rule): states from which an accepting state is reachable,
    through byte edges (table's 0 is no edge) and call edges `calls` [k, 3] of (state, rule,
    return state) whose rule is productive (its start state live)."""
    table = _i32(table)
    acc = np.ascontiguousarray(accept, dtype=np.uint8)
    src, rule, dst = _i32(calls[:, 0]), _i32(calls[:, 1]), _i32(calls[:, 2])
    starts = _i32(starts)
    live = np.zeros(table.shape[0], dtype=np.uint8)
    productive = np.zeros(len(starts), dtype=np.uint8)
    status = lib.live_states(table.shape[0], table.shape[1], _ptr(table), _ptr(acc, "uint8_t *"),
                             len(src), _ptr(src), _ptr(rule), _ptr(dst), len(starts), _ptr(starts),
                             _ptr(live, "uint8_t *"), _ptr(productive, "uint8_t *"))
    if status != lib.AUTOMATON_OK:
        raise MemoryError("automaton trimming ran out of memory")
    return live.astype(bool), productive.astype(bool)


def quotient_table(table: np.ndarray, rep: np.ndarray, block: np.ndarray) -> np.ndarray:
    """int32 [len(rep), classes]: block[table[rep[i], c]] (one pass: the numpy way took three
    arrays of a large schema's 10^7 cells)."""
    table = _i32(table)
    rep = np.ascontiguousarray(rep, dtype=np.int64)
    block = _i32(block)
    out = np.empty((len(rep), table.shape[1]), dtype=np.int32)
    lib.quotient_table(len(rep), table.shape[1], _ptr(table), _ptr(rep, "int64_t *"), _ptr(block), _ptr(out))
    return out


def minimize(table: np.ndarray, call_src, call_rule, call_dst, n_rules: int,
             first_block: np.ndarray) -> tuple[np.ndarray, int]:
    """(block per state, number of blocks): the coarsest refinement of `first_block` that the
    transitions (table's 0 is no edge) and call edges respect."""
    table = _i32(table)
    src, rule, dst = _i32(call_src), _i32(call_rule), _i32(call_dst)
    first = _i32(first_block)
    block = np.zeros(table.shape[0], dtype=np.int32)
    count = lib.minimize(table.shape[0], table.shape[1], _ptr(table), len(src), _ptr(src), _ptr(rule), _ptr(dst),
                         n_rules, _ptr(first), int(first.max()) + 1 if first.size else 0, _ptr(block))
    if count < 0:
        raise MemoryError("automaton minimisation ran out of memory")
    return block.astype(np.int64), int(count)


def token_edges(trans: np.ndarray, counted: np.ndarray, trie: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
                max_start_live: int = -1, first: int = 1, step: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """(src, dst) arrays of the distinct state pairs some trie token links, from the states
    first, first + step, ... (csrc/automaton.h). Runs without the GIL."""
    trans = _i32(trans)
    counted = np.ascontiguousarray(counted, dtype=np.uint8)
    child_off, child_byte, child_node, is_token = trie
    child_off, child_node = _i32(child_off), _i32(child_node)
    child_byte = np.ascontiguousarray(child_byte, dtype=np.uint8)
    is_token = np.ascontiguousarray(is_token, dtype=np.uint8)
    out = ffi.new("pair_result *")
    status = lib.token_edges(trans.shape[0], trans.shape[1], _ptr(trans), _ptr(counted, "uint8_t *"), max_start_live,
                             first, step, _ptr(child_off),
                             _ptr(child_byte, "uint8_t *"), _ptr(child_node), _ptr(is_token, "uint8_t *"), out)
    if status != lib.AUTOMATON_OK:
        raise MemoryError("token edges ran out of memory")
    try:
        return _copy(out.src, out.n_pairs, np.int32).astype(np.int64), _copy(out.dst, out.n_pairs, np.int32).astype(np.int64)
    finally:
        lib.pairs_free(out)


def shortest_distances(n: int, pred_off: np.ndarray, pred: np.ndarray, accept: np.ndarray,
                       hyper: tuple[np.ndarray, np.ndarray, np.ndarray], inf: int) -> np.ndarray:
    """U per state (csrc/automaton.h): unit edges by target (CSR), call hyperedges (g, a, b)."""
    pred_off, pred = _i32(pred_off), _i32(pred)
    accept = np.ascontiguousarray(accept, dtype=np.uint8)
    hg, ha, hb = (_i32(x) for x in hyper)
    # For each state, the hyperedges it is an input of.
    inputs = np.concatenate([ha, hb]).astype(np.int64)
    edge = np.concatenate([np.arange(hg.size), np.arange(hg.size)])
    order = np.argsort(inputs, kind="stable")
    by_input = _i32(edge[order])
    hyper_off = _i32(np.searchsorted(inputs[order], np.arange(n + 1)))
    U = np.empty(n, dtype=np.int32)
    status = lib.shortest_distances(n, _ptr(pred_off), _ptr(pred), _ptr(accept, "uint8_t *"), _ptr(hg), _ptr(ha),
                                    _ptr(hb), _ptr(hyper_off), _ptr(by_input), inf, _ptr(U))
    if status != lib.AUTOMATON_OK:
        raise MemoryError("shortest distances ran out of memory")
    return U
