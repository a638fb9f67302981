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

from .counting import INF, Counting
from .dfa import DEAD
from .vocab_index import VocabIndex

U16_INF = np.uint16(65535)


@dataclass
class Frame:
    u_end: np.ndarray      # uint16 [vocab]: U after the token (65535 = not allowed)
    cand_call: np.ndarray  # int64 token ids whose bytes may enter a call mid-token
    cand_ret: np.ndarray   # int64 token ids whose bytes may return to the caller mid-token
    # From a counted string's state, the parts of U that depend on the start count k (not set
    # otherwise): tokens ending inside the string (ids, U = a + c1 * max(0, lo - k - b), allowed
    # while k + b <= hi) and tokens leaving it after m characters (allowed for lo <= k + m <= hi).
    inside: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    left: tuple[np.ndarray, np.ndarray] | None = None
    reach: int = 0         # most characters one token adds: for lo <= k <= hi - reach, U is the same

    def steady(self, counting: Counting, g: int, k: int) -> bool:
        """Whether count k gives the same token table as every other steady count."""
        return self.inside is not None and counting.lo[g] <= k <= counting.hi[g] - self.reach

    def values(self, counting: Counting, g: int, k: int) -> np.ndarray:
        """uint16 [vocab]: U after each token from state g holding count k."""
        if self.inside is None:
            return self.u_end
        out = np.full(self.u_end.size, U16_INF, dtype=np.uint16)
        lo, hi, c1 = int(counting.lo[g]), int(counting.hi[g]), int(counting.c1[g])
        ids, a, b = self.inside
        u = a + c1 * np.maximum(0, lo - k - b)
        out[ids] = np.where(k + b <= hi, np.minimum(u, int(U16_INF)), U16_INF)
        ids, m = self.left
        out[ids] = np.where((lo <= k + m) & (k + m <= hi), self.u_end[ids], U16_INF)
        return out


class _Counts:
    """Per trie node of a level: count in the current string, still in the start state's
    string (phase 0, count relative to its start) or not (1), count when it left the start
    string. Counts change when a byte completes a character, enters or leaves a string."""

    def __init__(self, c: Counting, size: int, in_start_string: bool) -> None:
        self.c = c
        self.cnt = np.zeros(size, dtype=np.int64)
        self.phase = np.full(size, 0 if in_start_string else 1, dtype=np.uint8)
        self.left_at = np.zeros(size, dtype=np.int64)

    def take(self, pick) -> tuple:
        return self.cnt[pick], self.phase[pick], self.left_at[pick]

    def advance(self, prev: np.ndarray, st: np.ndarray, carried: tuple) -> np.ndarray:
        """States after the byte (DEAD where a bound breaks); updates the counts in place."""
        c = self.c
        cnt, phase, left_at = carried
        was, now = c.counted[prev], c.counted[st]
        inside = was & now
        cnt = cnt + (inside & c.head[st])
        leave = was & ~now & (st != DEAD)
        first_leave = leave & (phase == 0)
        bad = leave & (phase == 1) & ((cnt < c.lo[prev]) | (cnt > c.hi[prev]))
        bad |= inside & (cnt + c.mid[st] > c.hi[st])        # phase 0: no start count fits either
        self.left_at = np.where(first_leave, cnt, left_at)
        self.phase = np.where(first_leave, 1, phase).astype(np.uint8)
        self.cnt = np.where(leave | (~was & now), 0, cnt)
        return np.where(bad, DEAD, st)

    def u(self, st: np.ndarray, u16: np.ndarray, U: np.ndarray) -> np.ndarray:
        """U of the nodes in phase 1 (their count is absolute); phase-0 nodes get 0 here."""
        c = self.c
        out = u16[st].astype(np.int64)
        strings = c.counted[st] & (self.phase == 1)
        if strings.any():
            out[strings] = np.minimum(c.u_many(st[strings], self.cnt[strings], U), int(U16_INF))
        return np.where((self.phase == 0) & (st != DEAD), 0, out)


def walk(idx: VocabIndex, trans_flat: np.ndarray, n_cls: int, columns: list[np.ndarray], start: int,
         u16: np.ndarray, boundary: np.ndarray, counting: Counting | None = None, U: np.ndarray | None = None) -> Frame:
    """`trans_flat`: the table over byte classes (n_cls columns), flat; `columns[d]`: the column
    of each byte in `idx.bytes_[d]`. `u16[g]` is U clipped to uint16 (65535 = unreachable);
    `boundary[g]` the flag bits.
    With `counting` (None unless the grammar has counted strings; U: int64 distances), counts are
    followed along each token; from a counted `start`, relative to its count (Frame.values).

    Each level is processed either densely (all trie nodes of the level, plain gathers through
    the parent arrays; used when many prefixes are alive, e.g. inside strings) or sparsely
    (only the children of live nodes; used in structural states where almost all die)."""
    node_u = np.full(idx.n_nodes + 1, U16_INF, dtype=np.uint16)
    node_f = np.zeros(idx.n_nodes + 1, dtype=np.uint8)
    depth_max = len(idx.parents)
    counts = None
    if counting is not None:
        node_st = np.zeros(idx.n_nodes + 1, dtype=np.int64)
        node_cnt = np.zeros(idx.n_nodes + 1, dtype=np.int64)
        node_phase = np.ones(idx.n_nodes + 1, dtype=np.uint8)
        node_left = np.zeros(idx.n_nodes + 1, dtype=np.int64)
    cur = None                                   # None = every node of the level, in order
    if depth_max:
        st = trans_flat[start * n_cls + columns[0]]
        fl = np.zeros(st.size, dtype=np.uint8)
        if counting is not None:
            counts = _Counts(counting, st.size, bool(counting.counted[start]))
            st = counts.advance(np.full(st.size, start), st, counts.take(slice(None)))
    for d in range(1, depth_max + 1):
        off = idx.offsets[d]
        where = slice(off, off + st.size) if cur is None else off + cur
        node_u[where] = u16[st] if counts is None else counts.u(st, u16, U)
        node_f[where] = fl
        if counts is not None:
            node_st[where], node_cnt[where] = st, counts.cnt
            node_phase[where], node_left[where] = counts.phase, counts.left_at
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
            at = slice(None) if cur is None else cur
            pst[at] = np.where(keep, st, DEAD)
            pfl[at] = np.where(keep, fl | boundary[st], 0)
            par = idx.parents[d]
            if counts is not None:
                carried = []
                for arr in counts.take(slice(None)):
                    full = np.zeros(level, dtype=arr.dtype)
                    full[at] = arr
                    carried.append(full[par])
            prev = pst[par]
            st = trans_flat[prev * n_cls + columns[d]]
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
            if counts is not None:
                carried = [arr[keep][rep] for arr in counts.take(slice(None))]
            prev = pst[rep]
            st = trans_flat[prev * n_cls + columns[d][cur]]
            fl = pfl[rep]
        if counts is not None:
            st = counts.advance(prev, st, tuple(carried))
    u_end = node_u[idx.token_node]
    flags = node_f[idx.token_node]
    frame = Frame(u_end=u_end, cand_call=np.flatnonzero(flags & 1), cand_ret=np.flatnonzero(flags & 2))
    if counts is not None and counting.counted[start]:
        tok_st, tok_u = node_st[idx.token_node], u_end
        phase, cnt, left = node_phase[idx.token_node], node_cnt[idx.token_node], node_left[idx.token_node]
        ids = np.flatnonzero((phase == 0) & counting.counted[tok_st] & (tok_st != DEAD))
        g = tok_st[ids]
        a = np.where(counting.r[g] >= INF, INF, counting.r[g] + 1 + U[counting.exit[g]])
        ok = a < INF
        ids, g = ids[ok], g[ok]
        frame.inside = (ids, a[ok], cnt[ids] + counting.mid[g])
        out = np.flatnonzero((phase == 1) & (tok_u != U16_INF))
        frame.left = (out, left[out])
        frame.reach = int(max(frame.inside[2].max(initial=0), frame.left[1].max(initial=0)))
        frame.u_end = np.where(phase == 1, u_end, U16_INF).astype(np.uint16)
    return frame
