"""Length-bounded strings as a counter beside the automaton state (ir.Counted).

A counted string's states are tagged (dfa.py): its character boundary ("head") and the states
inside a character ("mid"). A matcher configuration for such a state carries k, the characters
completed so far; it is encoded as one int, `state + n_states * k`, so stacks stay tuples of
ints. Moves: completing a character adds one (at most `hi`, counting a started character);
leaving the string needs `lo <= k`.

Distance to completion from (g, k), achievable with single-byte tokens: finish the current
character (r[g] bytes), write the characters still missing (one char = c1 bytes), close the
string (one byte) and finish from the state after it:
    U(g, k) = r[g] + c1[g] * max(0, lo - k - mid[g]) + 1 + U[exit[g]]
An upper bound on the true minimum (longer tokens can do better), and exact to the step, so
the budget guarantee of distance.py holds.
"""
from __future__ import annotations

import numpy as np

from .dfa import DEAD, Automaton, CountConflict

INF = 2**30
_NO_LIMIT = 2**30


class Counting:
    """Per automaton state: the counter's bounds and what the distance formula needs."""

    def __init__(self, aut: Automaton, single: np.ndarray) -> None:
        """`single`: bool[256], the bytes that are tokens of their own."""
        n = aut.n_states
        tag = aut.count_tag
        self.n_states = n
        self.counted = tag > 0
        self.any = bool(self.counted.any())
        info = [(0, _NO_LIMIT, False)] + [(lo, _NO_LIMIT if hi is None else hi, head) for lo, hi, head in aut.count_tags]
        self.lo = np.array([lo for lo, _, _ in info], dtype=np.int64)[tag]
        self.hi = np.array([hi for _, hi, _ in info], dtype=np.int64)[tag]
        self.head = np.array([head for _, _, head in info], dtype=bool)[tag] & self.counted
        self.mid = (self.counted & ~self.head).astype(np.int64)
        self.r = np.zeros(n, dtype=np.int64)
        self.c1 = np.zeros(n, dtype=np.int64)
        self.exit = np.zeros(n, dtype=np.int64)     # the state after the closing quote (heads and mids)
        if self.any:
            self._check(aut)
            self._distances(aut, single)

    def _check(self, aut: Automaton) -> None:
        """The shape the counter relies on; anything else is unrolled by the caller instead."""
        trans, counted = aut.trans, self.counted
        bounds = self.lo * (_NO_LIMIT + 1) + self.hi
        for g in np.flatnonzero(counted):
            targets = np.unique(trans[g])
            targets = targets[targets != DEAD]
            inside = targets[counted[targets]]
            outside = targets[~counted[targets]]
            if aut.calls[g] or aut.accept[g] or (bounds[inside] != bounds[g]).any():
                raise CountConflict()
            if self.head[g]:
                if outside.size > 1:
                    raise CountConflict()
                self.exit[g] = outside[0] if outside.size else DEAD
            elif outside.size:
                raise CountConflict()
        entered = trans[~counted]
        if (counted[entered] & ~self.head[entered]).any():
            raise CountConflict()      # a string entered inside a character

    def _distances(self, aut: Automaton, single: np.ndarray) -> None:
        counted, head = self.counted, self.head
        trans, byte_class = aut.trans, np.frombuffer(aut.byte_class, dtype=np.uint8)
        cols = np.unique(byte_class[np.flatnonzero(single)])
        mids = np.flatnonzero(counted & ~head)
        r = np.where(head, 0, INF).astype(np.int64)
        head_of = np.where(head, np.arange(self.n_states), -1)
        for _ in range(16):                 # a character is at most 12 bytes (a \u surrogate pair)
            if not mids.size:
                break
            nxt = trans[mids][:, cols]
            cost = np.where(counted[nxt], r[nxt], INF)
            best = cost.argmin(axis=1)
            val = cost[np.arange(mids.size), best] + 1
            better = val < r[mids]
            if not better.any():
                break
            r[mids[better]] = val[better]
            head_of[mids[better]] = head_of[nxt[np.arange(mids.size), best]][better]
        heads = np.flatnonzero(head)
        nxt = trans[heads][:, cols]
        c1 = np.where(counted[nxt], r[nxt], INF).min(axis=1) + 1
        quote = trans[heads, byte_class[ord('"')]]
        closes = single[ord('"')] & (quote == self.exit[heads]) & (quote != DEAD)
        self.c1[heads] = c1
        self.exit[heads] = np.where(closes, self.exit[heads], DEAD)
        reached = head_of >= 0
        idx = np.flatnonzero(counted & reached)
        self.c1[idx] = self.c1[head_of[idx]]
        self.exit[idx] = self.exit[head_of[idx]]
        self.r = np.where(counted & reached, r, INF)
        self.exit[counted & ~reached] = DEAD

    def u(self, g: int, k: int, U) -> int:
        """Distance from (g, k); U: the distances of uncounted states (INF = none)."""
        tail = U[self.exit[g]]
        if tail >= INF or self.r[g] >= INF or self.c1[g] >= INF:
            return INF
        return int(self.r[g] + self.c1[g] * max(0, self.lo[g] - k - self.mid[g]) + 1 + tail)

    def u_many(self, g: np.ndarray, k: np.ndarray, U: np.ndarray) -> np.ndarray:
        """Vectorised u() for counted states g with counts k; U an int64 array."""
        tail = U[self.exit[g]]
        val = self.r[g] + self.c1[g] * np.maximum(0, self.lo[g] - k - self.mid[g]) + 1 + tail
        return np.where((tail >= INF) | (self.r[g] >= INF) | (self.c1[g] >= INF), INF, val)

    def step(self, x: int, n: int) -> int:
        """The configuration after a byte took x's state to state n (DEAD = not allowed)."""
        N = self.n_states
        g, k = x % N, x // N
        if not n:
            return 0
        if self.counted[g]:
            if self.counted[n]:
                k += int(self.head[n])
                return 0 if k + self.mid[n] > self.hi[n] else n + N * k
            return n if self.lo[g] <= k <= self.hi[g] else 0
        return n
