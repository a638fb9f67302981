"""Per-automaton-state token tables, by walking the vocabulary trie with numpy.

For a state g (the top of a stack), the walk gives, for every token, U of the state reached by
feeding the token's bytes through g's rule using byte edges only ("pure" path), and flags the
tokens whose path passes, strictly inside the token, through a state where a call may start
(flag 1) or where the rule may end and return to its caller (flag 2). Only flagged tokens need
an exact stack simulation; everything else is decided by the table.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .dfa import DEAD
from .vocab_index import VocabIndex

U16_INF = np.uint16(65535)


@dataclass
class Frame:
    u_end: np.ndarray      # uint16 [vocab]: U after the token (65535 = not allowed)
    cand_call: np.ndarray  # int64 token ids whose bytes may enter a call mid-token
    cand_ret: np.ndarray   # int64 token ids whose bytes may return to the caller mid-token


def walk(idx: VocabIndex, trans_flat: np.ndarray, start: int, u16: np.ndarray, boundary: np.ndarray) -> Frame:
    """`u16[g]` is U clipped to uint16 (65535 = unreachable); `boundary[g]` the flag bits.

    Each level is processed either densely (all trie nodes of the level, plain gathers through
    the parent arrays; used when many prefixes are alive, e.g. inside strings) or sparsely
    (only the children of live nodes; used in structural states where almost all die)."""
    node_u = np.full(idx.n_nodes + 1, U16_INF, dtype=np.uint16)
    node_f = np.zeros(idx.n_nodes + 1, dtype=np.uint8)
    depth_max = len(idx.parents)
    cur = None                                   # None = every node of the level, in order
    if depth_max:
        st = trans_flat[start * 256 + idx.bytes_[0]]
        fl = np.zeros(st.size, dtype=np.uint8)
    for d in range(1, depth_max + 1):
        off = idx.offsets[d]
        if cur is None:
            node_u[off:off + st.size] = u16[st]
            node_f[off:off + st.size] = fl
        else:
            node_u[off + cur] = u16[st]
            node_f[off + cur] = fl
        if d == depth_max:
            break
        keep = (st != DEAD) | (fl != 0)
        n_keep = int(np.count_nonzero(keep))
        if n_keep == 0:
            break
        level = idx.parents[d - 1].size
        if n_keep * 4 > level:
            # dense: full-level parent arrays, dead (and unflagged) entries stay DEAD / 0
            pst = np.zeros(level, dtype=st.dtype)
            pfl = np.zeros(level, dtype=np.uint8)
            where = slice(None) if cur is None else cur
            pst[where] = np.where(keep, st, DEAD)
            pfl[where] = np.where(keep, fl | boundary[st], 0)
            par = idx.parents[d]
            st = trans_flat[pst[par] * 256 + idx.bytes_[d]]
            fl = pfl[par]
            cur = None
        else:
            ids = np.flatnonzero(keep) if cur is None else cur[keep]
            pst, pfl = st[keep], (fl | boundary[st])[keep]
            cs, ce = idx.child_start[d][ids], idx.child_start[d][ids + 1]
            n_child = ce - cs
            total = int(n_child.sum())
            if total == 0:
                break
            rep = np.repeat(np.arange(ids.size), n_child)
            cur = np.repeat(cs - np.concatenate([[0], np.cumsum(n_child)[:-1]]), n_child) + np.arange(total)
            st = trans_flat[pst[rep] * 256 + idx.bytes_[d][cur]]
            fl = pfl[rep]
    u_end = node_u[idx.token_node]
    flags = node_f[idx.token_node]
    return Frame(u_end=u_end, cand_call=np.flatnonzero(flags & 1), cand_ret=np.flatnonzero(flags & 2))
