"""Pushdown: a compiled grammar's tables and how a state set moves over bytes and tokens.

The state of a parse is a set of stacks of automaton states (the top state is in the rule being
matched, lower entries are return states); compiled.py builds the tables from a schema.
"""
from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

from . import dfa, distance
from .counting import Counting
from .frames import U16_INF, Frame, walk
from .vocab_index import VocabIndex

Stack = tuple[int, ...]        # global automaton states, bottom (root rule) ... top
StateSet = frozenset           # of Stack: the live parses (more than one only with recursion)

INF = int(distance.INF)
MAX_STACKS = 512
# nbytes(): rough Python object sizes. Per state, pointers in five lists and an int object;
# a transition row is a list over 256 bytes; a cached step or closure is a key, a frozenset of
# tuples and a dict slot.
_PER_STATE_LISTS = 5 * 8 + 32
_ROW = 256 * 8 + 56
_CACHE_ENTRY = 400


class Pushdown:
    """Immutable once built, except for caches, so safe to share between threads: the mask and
    frame caches sit behind a lock; the transition rows (`row`) do not need it, since threads
    racing to fill one store equal lists."""

    json_document = True  # the output parses as JSON (compiled.py: not for tool calls in a model's syntax)

    def __init__(self, idx: VocabIndex, aut: dfa.Automaton, U: np.ndarray, counting: Counting,
                 unique_rules: dict[int, int], frame_cache: int, mask_cache: int) -> None:
        """From the automaton, its token distances `U` (per state) and the array rules whose
        items unique.py keeps distinct (rule: kind)."""
        # Make token-unreachable-to-accept states dead, so that table walks and byte-wise
        # simulation agree (both then only ever see states with finite U).
        unfinishable = U >= INF
        trans = aut.trans.astype(np.int32, copy=False)
        if unfinishable[1:].any():      # rare after trimming: skip two passes over the table
            trans = np.where(unfinishable[trans], dfa.DEAD, trans).astype(np.int32, copy=False)
            trans[unfinishable] = dfa.DEAD
        self.idx = idx
        self.trans = trans                      # over byte classes: [states, classes]
        self.trans_flat = trans.reshape(-1)     # a view; int32 halves memory traffic in walks
        self.byte_class = np.frombuffer(aut.byte_class, dtype=np.uint8).astype(np.int32)
        self._columns: list[np.ndarray] | None = None    # the vocabulary trie's bytes as columns
        self._rows: dict[int, list[int]] = {}
        self.accept = aut.accept.tolist()
        self.U = U.tolist()
        self.u16 = np.minimum(U, int(U16_INF)).astype(np.uint16)
        self.rule_start = aut.rule_start
        edges = aut.call_edges      # (state, rule, return state): those that can finish
        edges = edges[(U[edges[:, 2]] < INF) & (U[np.asarray(aut.rule_start, dtype=np.int64)[edges[:, 1]]] < INF)]
        self.calls = dfa.calls_by_state(edges, aut.n_states)
        self.has_out = trans.any(axis=1).tolist()       # DEAD is 0
        # Arrays whose items the matcher keeps distinct (unique.py): the kind of each state
        # inside one (an array rule accepts only once its ']' is written), and the states
        # right after their '['.
        self.unique_states = self.unique_open = None
        if unique_rules:
            kinds = np.zeros(len(aut.rule_start), dtype=np.int8)
            for r, kind in unique_rules.items():
                kinds[r] = kind
            self.unique_states = np.where(aut.accept, 0, kinds[aut.rule_of]).tolist()
            bracket = self.byte_class[ord("[")]
            self.unique_open = frozenset(int(trans[aut.rule_start[r], bracket]) for r in unique_rules) - {dfa.DEAD}
        boundary = np.zeros(aut.n_states, dtype=np.uint8)
        boundary[edges[:, 0]] = 1
        boundary |= (aut.accept & (aut.rule_of > 0)).astype(np.uint8) * 2
        self.boundary = boundary
        self.recursive = len(aut.rule_start) > 1
        self.n_states = aut.n_states
        self.counting = counting if counting.any else None
        self._U64 = np.asarray(U, dtype=np.int64)
        self.start: StateSet = frozenset([(aut.rule_start[0],)])
        self._lock = threading.Lock()
        self._frames: OrderedDict[int, Frame] = OrderedDict()
        self._frame_cap = frame_cache
        self._step: dict[tuple[StateSet, int], StateSet] = {}
        self._closure: dict[StateSet, frozenset] = {}
        self._best: OrderedDict[StateSet, np.ndarray] = OrderedDict()
        # Unbudgeted masks per state set, shared read-only by every matcher: the sampler keys
        # its per-mask work (ids, additive bias) on the array, so reuse makes that work cached.
        self._masks: OrderedDict[StateSet, tuple[np.ndarray, int]] = OrderedDict()
        self._mask_cap = mask_cache
        self._live: dict[int, tuple[int, ...]] = {}   # state -> bytes it has a transition on
        self._forced: dict[tuple[StateSet, int], tuple[bytes, bool]] = {}

    def nbytes(self) -> int:
        """An estimate of the memory this grammar holds: its tables, and what it has cached so
        far (token tables, masks, rows, steps), which grows as requests use it."""
        arrays = [self.trans, self.byte_class, self.u16, self.boundary, self._U64, *(self._columns or ())]
        with self._lock:
            for f in self._frames.values():
                arrays += [f.u_end, f.cand_call, f.cand_ret, *(f.inside or ()), *(f.left or ())]
            arrays += [mask for mask, _ in self._masks.values()]
            arrays += list(self._best.values())
        total = sum(a.nbytes for a in arrays)
        total += self.n_states * _PER_STATE_LISTS + len(self._rows) * _ROW
        total += (len(self._step) + len(self._closure) + len(self._forced) + len(self._live)) * _CACHE_ENTRY
        return total

    # ------------------------------------------------------------ stack simulation
    def row(self, g: int) -> list[int]:
        r = self._rows.get(g)
        if r is None:
            r = self._rows[g] = self.trans[g][self.byte_class].tolist()
        return r

    def closure(self, S: StateSet) -> frozenset:
        """Configurations whose top state consumes the next byte (after calls / returns)."""
        c = self._closure.get(S)
        if c is not None:
            return c
        out: set[Stack] = set()
        todo = list(S)
        while todo:
            s = todo.pop()
            if s in out:
                continue
            out.add(s)
            g = s[-1]
            if g >= self.n_states:     # a counted string's configuration: no calls, no return
                continue
            for q, ret in self.calls[g]:
                todo.append(s[:-1] + (ret, self.rule_start[q]))
            if len(s) > 1 and self.accept[g]:
                todo.append(s[:-1])
        c = frozenset(out)
        if len(self._closure) > 100_000:
            self._closure.clear()
        self._closure[S] = c
        return c

    def step(self, S: StateSet, b: int) -> StateSet:
        key = (S, b)
        r = self._step.get(key)
        if r is not None:
            return r
        out = set()
        counting = self.counting
        for c in (S if not self.recursive else self.closure(S)):
            x = c[-1]
            if counting is None:
                n = self.row(x)[b]
            else:
                n = counting.step(x, self.row(x % self.n_states)[b])
            if n:
                out.add(c[:-1] + (n,))
        if len(out) > MAX_STACKS:
            raise RuntimeError("grammar too ambiguous: too many simultaneous parses")
        r = frozenset(out)
        if len(self._step) > 500_000:
            self._step.clear()
        self._step[key] = r
        return r

    def run(self, S: StateSet, data: bytes) -> StateSet:
        for b in data:
            S = self.step(S, b)
            if not S:
                break
        return S

    def forced_bytes(self, S: StateSet, limit: int) -> tuple[bytes, bool]:
        """(the bytes the grammar admits as the only continuation of S, at most `limit`; whether
        they finish the document). None once S is complete: the document could end there."""
        key = (S, limit)
        hit = self._forced.get(key)
        if hit is not None:
            return hit
        out = bytearray()
        while len(out) < limit and not self.is_complete(S):
            only = self._only_byte(S)
            if only is None:
                break
            out.append(only)
            S = self.step(S, only)
        if len(self._forced) > 100_000:
            self._forced.clear()
        self._forced[key] = forced = (bytes(out), bool(out) and self.is_finished(S))
        return forced

    def next_bytes(self, S: StateSet) -> frozenset[int]:
        """Bytes some configuration of S has a transition on (length bounds aside: a superset)."""
        out: set[int] = set()
        for c in (S if not self.recursive else self.closure(S)):
            out.update(self._live_bytes(c[-1] % self.n_states))
        return frozenset(out)

    def _live_bytes(self, g: int) -> tuple[int, ...]:
        live = self._live.get(g)
        if live is None:
            live = self._live[g] = tuple(np.flatnonzero(self.trans[g][self.byte_class] != dfa.DEAD).tolist())
        return live

    def _only_byte(self, S: StateSet) -> int | None:
        only = None
        for c in (S if not self.recursive else self.closure(S)):
            x = c[-1]
            g = x % self.n_states
            for b in self._live_bytes(g):
                if self.counting is not None and not self.counting.step(x, self.row(g)[b]):
                    continue
                if only is None:
                    only = b
                elif b != only:
                    return None
        return only

    def distance(self, S: StateSet) -> int:
        if self.counting is None:
            U = self.U
            return min((sum(U[g] for g in s) for s in S), default=INF)
        return min((sum(self._u(x) for x in s) for s in S), default=INF)

    def _u(self, x: int) -> int:
        """Distance of one stack entry (a state, or a counted string's state and count)."""
        if x < self.n_states:
            return self.U[x]
        return min(self.counting.u(x % self.n_states, x // self.n_states, self.U), INF)

    def is_complete(self, S: StateSet) -> bool:
        return self.distance(S) == 0

    def is_finished(self, S: StateSet) -> bool:
        if not self.is_complete(S):
            return False
        configs = self.closure(S) if self.recursive else S
        return not any(self.has_out[c[-1] % self.n_states] for c in configs)

    # ------------------------------------------------------------ token tables
    def frame(self, g: int) -> Frame:
        with self._lock:
            f = self._frames.get(g)
            if f is not None:
                self._frames.move_to_end(g)
                return f
        if self._columns is None:   # on first use: one lookup per vocabulary token
            self._columns = [self.byte_class[b] for b in self.idx.bytes_]
        f = walk(self.idx, self.trans_flat, self.trans.shape[1], self._columns, g, self.u16, self.boundary,
                 self.counting, self._U64)
        with self._lock:
            self._frames[g] = f
            while len(self._frames) > self._frame_cap:
                self._frames.popitem(last=False)
        return f

    def _canonical(self, S: StateSet) -> StateSet:
        """S with each counted string's count replaced by its lower bound where the count makes
        no difference to any token (lo <= k <= hi - the most one token adds): masks and tables
        are then shared along a long string instead of rebuilt per character."""
        if self.counting is None:
            return S
        N = self.n_states
        out = set()
        for s in S:
            x = s[-1]
            if x >= N:
                g, k = x % N, x // N
                if self.frame(g).steady(self.counting, g, k):
                    s = s[:-1] + (g + N * int(self.counting.lo[g]),)
            out.add(s)
        return frozenset(out)

    def unbudgeted_mask(self, S: StateSet) -> tuple[np.ndarray, int]:
        """(read-only bool[vocab] of the tokens allowed after S, EOG included when S is complete;
        the largest finite distance among them, -1 if none): the mask whenever the remaining
        token budget exceeds that distance."""
        S = self._canonical(S)
        with self._lock:
            hit = self._masks.get(S)
            if hit is not None:
                self._masks.move_to_end(S)
                return hit
        best = self.best(S)
        mask = best != U16_INF
        finite = best[mask]
        longest = int(finite.max()) if finite.size else -1
        if self.is_complete(S):
            mask[self.idx.eog] = True
        mask.flags.writeable = False
        with self._lock:
            self._masks[S] = (mask, longest)
            while len(self._masks) > self._mask_cap:
                self._masks.popitem(last=False)
        return mask, longest

    def cached_frame(self, g: int) -> Frame | None:
        return self._frames.get(g)

    def _values(self, x: int) -> tuple[Frame, np.ndarray]:
        """(frame of x's state, uint16 [vocab] U after each token from configuration x)."""
        g = x % self.n_states
        f = self.frame(g)
        return f, f.u_end if f.inside is None else f.values(self.counting, g, x // self.n_states)

    def best(self, S: StateSet) -> np.ndarray:
        """uint16 [vocab]: U of the state set after each token (65535 = not allowed)."""
        S = self._canonical(S)
        if len(S) == 1:
            (s,) = S
            if len(s) == 1 and not self.calls[s[0] % self.n_states]:
                f = self.frame(s[0] % self.n_states)
                if not f.cand_call.size and f.inside is None:
                    return f.u_end          # the common case: the table alone is exact
        with self._lock:
            hit = self._best.get(S)
            if hit is not None:
                self._best.move_to_end(S)
                return hit
        best = None
        cands: set[int] = set()
        for c in self.closure(S):
            rest = sum(self._u(x) for x in c[:-1])
            f, u = self._values(c[-1])
            val = u.astype(np.int64)
            val[u == U16_INF] = INF
            val += rest
            best = val if best is None else np.minimum(best, val)
            cands.update(f.cand_call.tolist())
            if len(c) > 1:
                cands.update(f.cand_ret.tolist())
        for t in cands:
            best[t] = self.distance(self.run(S, self.idx.token_bytes[t]))
        out = np.minimum(best, int(U16_INF)).astype(np.uint16)
        with self._lock:
            self._best[S] = out
            while len(self._best) > 64:
                self._best.popitem(last=False)
        return out

    def token_distance(self, S: StateSet, t: int) -> int:
        """U after token t (INF if not allowed), without building a full table if possible."""
        if self.idx.excluded[t]:
            return INF
        if len(S) == 1:
            (s,) = S
            if len(s) == 1 and s[0] < self.n_states and not self.calls[s[0]]:
                f = self.cached_frame(s[0])
                if f is not None and not f.cand_call.size and f.inside is None:
                    v = int(f.u_end[t])
                    return INF if v == int(U16_INF) else v
        hit = self._best.get(S)
        if hit is not None:
            v = int(hit[t])
            return INF if v == int(U16_INF) else v
        return self.distance(self.run(S, self.idx.token_bytes[t]))
