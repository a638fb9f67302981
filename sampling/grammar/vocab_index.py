"""A byte trie of the vocabulary as flat numpy arrays, built once per TokenVocabulary.

Trie nodes are grouped by depth; at depth d, node i has a parent index (into depth d-1) and a
byte; siblings are contiguous and sorted. Running an automaton over the trie level by level
computes the state after every token with one vectorised gather per level, and lets whole
subtrees be skipped once their prefix is dead.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable, TypeVar

import numpy as np

from ..vocabulary import TokenVocabulary


T = TypeVar("T")


@dataclass
class VocabIndex:
    size: int
    token_bytes: tuple[bytes, ...]
    parents: list[np.ndarray]      # per depth d >= 1: int64 index of the parent at depth d-1
    bytes_: list[np.ndarray]       # per depth d >= 1: int64 byte value
    child_start: list[np.ndarray]  # per depth d >= 0: first child at depth d+1 (len = nodes+1)
    offsets: np.ndarray            # global id of node i at depth d = offsets[d] + i
    token_node: np.ndarray         # int64 global node id per token; n_nodes (a sentinel) if excluded
    n_nodes: int
    eog: np.ndarray                # int64 EOG token ids
    eog_set: frozenset[int]
    excluded: np.ndarray           # bool: never allowed as text (empty bytes or special)
    single_byte: dict[int, int]    # byte value -> a token that is exactly that byte
    # Tables other modules derive from the vocabulary, built once per index (derived()).
    _derived: dict = field(default_factory=dict, repr=False, compare=False)

    def derived(self, key: object, build: Callable[[], T]) -> T:
        """`build()`'s result, kept with this index under `key` (racing threads may both build;
        one result is kept)."""
        hit = self._derived.get(key)
        if hit is None:
            hit = self._derived.setdefault(key, build())
        return hit


_CACHE: dict[int, tuple[None, TokenVocabulary, VocabIndex]] = {}
_LOCK = threading.Lock()


def index_for(vocab: TokenVocabulary) -> VocabIndex:
    with _LOCK:
        hit = _CACHE.get(id(vocab))
        if hit is not None and hit[1] is vocab:
            return hit[2]
        idx = _build(vocab)
        _CACHE[id(vocab)] = (None, vocab, idx)   # keeps vocab alive, so its id is never reused
        return idx


def _build(vocab: TokenVocabulary) -> VocabIndex:
    toks = vocab.token_bytes
    n = len(toks)
    # EOG tokens are never text: they are allowed separately, only when the document is complete.
    bad = vocab.special_tokens | vocab.eog_tokens
    excluded = np.array([not b or i in bad for i, b in enumerate(toks)], dtype=bool)
    ids = np.flatnonzero(~excluded)
    lens = np.array([len(toks[i]) for i in ids], dtype=np.int64)
    max_len = int(lens.max()) if lens.size else 0
    mat = np.zeros((ids.size, max_len), dtype=np.int64)
    flat = np.frombuffer(b"".join(toks[i] for i in ids), dtype=np.uint8)
    rows = np.repeat(np.arange(ids.size), lens)
    cols = np.arange(flat.size) - np.repeat(np.cumsum(lens) - lens, lens)
    mat[rows, cols] = flat
    parents, bytes_, child_start = [], [], []
    node = np.zeros(ids.size, dtype=np.int64)          # node at the current depth per token
    counts = [1]
    token_node = np.full(n, -1, dtype=np.int64)
    token_depth_node = []
    for d in range(1, max_len + 1):
        active = np.flatnonzero(lens >= d)
        key = node[active] * 256 + mat[active, d - 1]
        uniq, inv = np.unique(key, return_inverse=True)
        parents.append((uniq // 256).astype(np.int32))   # int32: the walk is bandwidth-bound
        bytes_.append((uniq % 256).astype(np.int32))
        child_start.append(np.searchsorted(uniq // 256, np.arange(counts[-1] + 1)).astype(np.int32))
        node[active] = inv.ravel()
        counts.append(uniq.size)
        ends = active[lens[active] == d]
        token_depth_node.append((ends, d))
        token_node[ids[ends]] = node[ends]    # local index for now
    offsets = np.concatenate([[0], np.cumsum(counts)])
    for ends, d in token_depth_node:
        token_node[ids[ends]] += offsets[d]
    n_nodes = int(offsets[-1])
    token_node[excluded] = n_nodes
    single = {}
    for i in ids[lens == 1][::-1]:
        single[toks[i][0]] = int(i)
    eog = np.array(sorted(vocab.eog_tokens), dtype=np.int64)
    return VocabIndex(
        size=n, token_bytes=toks, parents=parents, bytes_=bytes_, child_start=child_start,
        offsets=offsets, token_node=token_node, n_nodes=n_nodes, eog=eog,
        eog_set=frozenset(vocab.eog_tokens), excluded=excluded, single_byte=single,
    )
